-- GGUF files as models: models/stories260K-gguf (llama.cpp's own conversion of the llama2.c
-- checkpoint) against run.c's outputs, models/llama2-tiny-random-gguf (F16, untied, the whole
-- Llama 2 vocabulary) against its references, the tokenizer from GGUF metadata against
-- SentencePiece and llama.cpp's test vectors, and synthetic Hugging Face models converted to GGUF
-- the way llama.cpp's converter does (q/k rows of `llama` permuted to Meta's order; qwen2/qwen3
-- as they are; Llama 3's RoPE scaling as rope_freqs) against the same model in Hugging Face form.
-- Then slice stores made from a GGUF, chat templates from its metadata, and clear errors.
local ffi = require "ffi"
local loip = require "loip"
local json = require "loip.text.json"
local gguf = require "loip.model.gguf"
local families = require "loip.model.families"
local T = require "spec.support"

local TOL = 1e-4

local function fixture(rel)
  local p, why = T.fixture_path(rel)
  if not p then pending(why) end
  return p
end

after_each(function() T.cleanup() collectgarbage() collectgarbage() end)

local function check_logits(m, ids, file, vocab, tol)
  local ref, n = T.read_f32(file)
  assert.are.equal(#ids * vocab, n)
  local out = m:logits(ids)
  local d = T.max_abs_diff(out, ref, n)
  assert.is_true(d < (tol or TOL), string.format("%s: max |diff| %.3g", file, d))
end

-- The text and ids of a greedy generation.
local function greedy(m, prompt, n, stop)
  local it, st = m:generate(prompt, { temperature = 0, max_tokens = n, stop = stop })
  local text = {}
  for _, piece in it do text[#text + 1] = piece end
  return table.concat(text), st.token_ids
end

describe("stories260K.gguf (llama.cpp's conversion) against run.c", function()
  -- (run.c's outputs: stories260K-gguf's reference/ is a byte-identical copy of stories260K's,
  -- which the repository ships once)
  local function ref(name) return fixture("models/stories260K/reference/" .. name) end
  local m
  local function model()
    -- the GGUF says context_length 128 (the converter's default): run.c's references go to 201
    m = m or loip.model.open(fixture("models/stories260K-gguf/stories260K.gguf"), { context = 512 })
    return m
  end
  teardown(function() if m then m:close() end end)

  it("opens as a llama model with its interleaved RoPE and an explicit output", function()
    local mm = model()
    assert.are.equal("gguf", mm.facts.format)
    assert.are.equal(loip.C.LOIP_ROPE_INTERLEAVED, mm.cfg.rope_layout)
    assert.are.equal(0, mm.cfg.tied_embeddings)
    assert.are.equal("gguf", mm.tokenizer.kind)
    assert.are.equal(128, mm.cfg.max_seq)
  end)

  it("matches run.c's logits (seqA, seqB, the 201-position greedy sequence)", function()
    local mm = model()
    check_logits(mm, { 1, 403, 407, 261, 378, 432, 383, 286 }, ref("logits_seqA.f32"), 512)
    check_logits(mm, { 1, 100, 500, 42, 7, 300, 511, 3 }, ref("logits_seqB.f32"), 512)
    local g = assert(json.load(ref("greedy.json")))
    check_logits(mm, g.cases[1].sequence_ids, ref("logits_greedy_full.f32"), 512)
  end)

  it("generates run.c's greedy text for every reference prompt", function()
    local mm = model()
    local g = assert(json.load(ref("greedy.json")))
    for _, c in ipairs(g.cases) do
      assert.are.same(c.prompt_ids, mm.tokenizer:encode(c.prompt))
      local text, ids = greedy(mm, c.prompt, g.steps - #c.prompt_ids + 1, { 1 })
      assert.are.same(c.generated_ids, ids)
      assert.are.equal(c.output_text, mm.tokenizer:decode(c.prompt_ids):gsub("^ ", "") .. text)
    end
  end)

  it("encodes run.c's 18 strings as run.c does", function()
    local cases = assert(json.load(ref("encode.json"))).cases
    local tok = model().tokenizer
    for _, c in ipairs(cases) do assert.are.same(c.ids, tok:encode(c.text), string.format("%q", c.text)) end
  end)
end)

describe("llama-2-tiny-random.gguf (F16, untied, Llama 2 vocabulary)", function()
  local function ref()
    return assert(json.load(fixture("models/llama2-tiny-random-gguf/reference/reference.json")))
  end

  it("matches run.c's logits at 8 positions and its greedy text", function()
    local r = ref()
    local m = loip.model.open(fixture("models/llama2-tiny-random-gguf"))
    assert.are.equal(0, m.cfg.tied_embeddings)
    assert.are.equal(32000, m.vocab_size)
    check_logits(m, r.token_ids, fixture("models/llama2-tiny-random-gguf/reference/logits_hello.f32"), 32000)
    assert.are.same({ 1, 15043, 3186, 29892, 445, 338, 263, 1243 }, m.tokenizer:encode("Hello world, this is a test"))
    local text, ids = greedy(m, r.greedy.prompt, #r.greedy.sequence_ids - #r.greedy.prompt_ids)
    local want = {}
    for i = #r.greedy.prompt_ids + 1, #r.greedy.sequence_ids do want[#want + 1] = r.greedy.sequence_ids[i] end
    assert.are.same(want, ids)
    assert.are.equal(r.greedy.output_text, r.greedy.prompt .. text)
    m:close()
  end)
end)

local vectors = T.ggml_vectors

local function check_vectors(tok, cases, opts)
  local n = 0
  for _, c in ipairs(cases) do
    assert.are.same(c.ids, tok:encode(c.text, opts), string.format("%q", c.text))
    n = n + 1
  end
  return n
end

describe("the tokenizer in GGUF metadata", function()
  local plain = { add_special = false, parse_special = false }

  it("model llama: equals SentencePiece on its 57 strings and llama.cpp on its 46 vectors", function()
    local d = fixture("models/llama2-tokenizer")
    local path = d .. "/ggml-vocab-llama-spm.gguf" -- a vocabulary alone: no tensors
    local tok = loip.tokenizer.open_file(path)
    assert.are.equal("gguf", tok.kind)
    assert.are.equal(32000, tok.vocab_size)
    assert.are.equal("<s>", tok.bos_token)
    local ref = require("cjson").decode(T.read(d .. "/reference/sentencepiece_reference.json")).cases
    assert.are.equal(57, check_vectors(tok, ref, plain))
    local spm = loip.tokenizer.open_file(d .. "/tokenizer.model")
    for _, c in ipairs(ref) do
      assert.are.equal(c.decoded, tok:decode(c.ids))
      assert.are.same(spm:encode(c.text), tok:encode(c.text))
    end
    assert.are.equal(46, check_vectors(tok,
      vectors(d .. "/reference/ggml-vocab-llama-spm.gguf.inp", d .. "/reference/ggml-vocab-llama-spm.gguf.out"), plain))
    -- BOS by default (tokenizer.ggml.add_bos_token absent: llama's default), control tokens as text
    assert.are.same({ 1, 15043 }, tok:encode("Hello"))
    assert.are.same({ 1, 1, 15043 }, tok:encode("<s>Hello"))
    tok:close() spm:close()
  end)

  it("model gpt2 (pre qwen2): a GGUF vocabulary from Qwen2's files passes llama.cpp's 46 vectors", function()
    local d = fixture("models/qwen2-tokenizer")
    local vocab = require("cjson").decode(T.read(d .. "/vocab.json"))
    local added = require("cjson").decode(T.read(d .. "/added_tokens.json"))
    local tokens, types = {}, {}
    for piece, id in pairs(vocab) do tokens[id + 1], types[id + 1] = piece, 1 end
    for piece, id in pairs(added) do tokens[id + 1], types[id + 1] = piece, 3 end
    assert.are.equal(151646, #tokens)
    local merges = {}
    for line in T.read(d .. "/merges.txt"):gmatch("[^\n]+") do
      if not line:match("^#version") then merges[#merges + 1] = line end
    end
    local path = T.tmpdir() .. "/qwen2-vocab.gguf"
    T.write(path, gguf.encode({
      { "general.architecture", "STRING", "qwen2" },
      { "tokenizer.ggml.model", "STRING", "gpt2" }, { "tokenizer.ggml.pre", "STRING", "qwen2" },
      { "tokenizer.ggml.tokens", "ARRAY[STRING]", tokens }, { "tokenizer.ggml.token_type", "ARRAY[INT32]", types },
      { "tokenizer.ggml.merges", "ARRAY[STRING]", merges },
      { "tokenizer.ggml.eos_token_id", "UINT32", 151643 }, { "tokenizer.ggml.bos_token_id", "UINT32", 151643 },
      { "tokenizer.ggml.add_bos_token", "BOOL", false },
    }))
    local tok = loip.tokenizer.open_file(path)
    assert.are.equal("qwen2", tok.pretokenizer)
    local cases = vectors(d .. "/reference/ggml-vocab-qwen2.gguf.inp", d .. "/reference/ggml-vocab-qwen2.gguf.out")
    assert.are.equal(46, check_vectors(tok, cases))
    for _, c in ipairs(cases) do assert.are.equal(c.text, tok:decode(tok:encode(c.text))) end
    assert.are.same({ 151644, 872 }, tok:encode("<|im_start|>user"))
    tok:close()
  end)

  it("refuses what it cannot read, naming the key", function()
    local path = T.tmpdir() .. "/v.gguf"
    local function try(md)
      T.write(path, gguf.encode(md))
      local ok, err = pcall(loip.tokenizer.open_file, path)
      assert.is_false(ok)
      return err
    end
    assert.matches("tokenizer.ggml.model is missing", try({ { "general.architecture", "STRING", "llama" } }))
    assert.matches("tokenizer.ggml.model 'bert' is not supported", try({ { "tokenizer.ggml.model", "STRING", "bert" },
      { "tokenizer.ggml.tokens", "ARRAY[STRING]", { "a" } } }))
    assert.matches("tokenizer.ggml.scores has 1 entries, tokenizer.ggml.tokens 2", try({
      { "tokenizer.ggml.model", "STRING", "llama" }, { "tokenizer.ggml.tokens", "ARRAY[STRING]", { "a", "b" } },
      { "tokenizer.ggml.scores", "ARRAY[FLOAT32]", { 0 } } }))
    assert.matches("tokenizer.ggml.pre 'nonesuch'", try({ { "tokenizer.ggml.model", "STRING", "gpt2" },
      { "tokenizer.ggml.tokens", "ARRAY[STRING]", { "a", "b", "ab" } }, { "tokenizer.ggml.merges", "ARRAY[STRING]", { "a b" } },
      { "tokenizer.ggml.pre", "STRING", "nonesuch" } }))
    assert.matches("tokenizer.ggml.eos_token_id = 9 is not a token id in %[0, 2%)", try({
      { "tokenizer.ggml.model", "STRING", "llama" }, { "tokenizer.ggml.tokens", "ARRAY[STRING]", { "a", "b" } },
      { "tokenizer.ggml.eos_token_id", "UINT32", 9 } }))
  end)
end)

-- ---- Hugging Face -> GGUF, as llama.cpp's convert_hf_to_gguf.py writes it (spec/support/to_gguf.lua)

local convert = require("spec.support.to_gguf").convert

describe("Hugging Face models converted to GGUF as llama.cpp does", function()
  local cases = {
    { "Llama 3.2 (pairs RoPE, llama3 scaling from rope_freqs, tied, BF16)", "llama-3.2-1b", "bf16", "llama", "" },
    { "Llama 3.1 (untied, F32)", "llama-3.1-8b", "f32", "llama", "" },
    { "Qwen2 (biases, F16)", "qwen2.5-0.5b", "f16", "qwen2", "" },
    { "Qwen3 (q/k norms, head_dim 24, BF16)", "qwen3-0.6b", "bf16", "qwen3", "--head-dim 24" },
  }
  for _, c in ipairs(cases) do
    it("give the Hugging Face model's logits: " .. c[1], function()
      local dir = T.tmpdir()
      local cmd = string.format("LOIP_QUIET=1 %s synth --like %s --dtype %s --layers 2 --dim 64 --heads 4 --kv-heads 2 %s --ffn 96 --vocab 300 --seed 5 --std 0.3 %s/hf",
        T.loip, c[2], c[3], c[5], dir)
      local rc, _, err = T.run(cmd)
      assert.are.equal(0, rc, err)
      convert(dir .. "/hf", dir .. "/m.gguf", c[4])
      local ids = { 1, 17, 290, 45, 100, 7, 260, 33, 12 }
      local a = loip.model.open(dir .. "/hf", { threads = 1 })
      local b = loip.model.open(dir .. "/m.gguf", { threads = 1 })
      assert.are.equal(c[4] == "llama" and loip.C.LOIP_ROPE_INTERLEAVED or loip.C.LOIP_ROPE_HALF, b.cfg.rope_layout)
      assert.are.equal(a.cfg.rope_scaling, b.cfg.rope_scaling)
      assert.are.equal(a.cfg.tied_embeddings, b.cfg.tied_embeddings)
      local la, lb = a:logits(ids), b:logits(ids)
      local n, worst, scale = #ids * a.vocab_size, 0, 0
      for i = 0, n - 1 do
        worst = math.max(worst, math.abs(la[i] - lb[i]))
        scale = math.max(scale, math.abs(la[i]))
      end
      assert.is_true(scale > 1, "logits too small to test anything")
      -- the same weights; only the order of the sums over head dimensions differs
      assert.is_true(worst < 1e-5 * scale, string.format("max |diff| %.3g of max |logit| %.3g", worst, scale))
      a:close() b:close()
    end)
  end
end)

describe("slice stores made from a GGUF", function()
  it("hold the GGUF's bytes and run as the GGUF does, on one device and on two", function()
    local src = fixture("models/stories260K-gguf/stories260K.gguf")
    local out = T.tmpdir() .. "/store"
    local man = require("loip.model.slice").write(src, out, { quiet = true })
    assert.are.equal("gguf", man.source.format)
    assert.are.equal("interleaved", man.config.loip_rope_layout)
    -- every block file's tensors are the GGUF's bytes
    local g = gguf.open(src)
    local names = { ["model.embed_tokens.weight"] = "token_embd.weight", ["lm_head.weight"] = "output.weight",
      ["model.layers.3.self_attn.k_proj.weight"] = "blk.3.attn_k.weight", ["model.layers.0.mlp.down_proj.weight"] = "blk.0.ffn_down.weight" }
    local seen = 0
    for _, f in ipairs(man.files) do
      local bytes = T.read(out .. "/" .. f.name)
      for _, t in ipairs(f.tensors) do
        if names[t.name] then
          local p, n = g:data(names[t.name])
          assert.are.equal(ffi.string(p, n), bytes:sub(t.offset + 1, t.offset + t.nbytes), t.name)
          seen = seen + 1
        end
      end
    end
    assert.are.equal(4, seen)
    -- the vocabulary travels as the GGUF's metadata, byte for byte
    local meta = T.read(out .. "/tokenizer.gguf")
    assert.are.equal(T.read(src):sub(25, g.meta_end), meta:sub(25))
    g:close()
    local a = loip.model.open(src, { context = 256 })
    local b = loip.model.open(out, { context = 256 })
    assert.are.equal("gguf", b.tokenizer.kind)
    local ta, ia = greedy(a, "Once upon a time", 60)
    local tb, ib = greedy(b, "Once upon a time", 60)
    assert.are.same(ia, ib)
    assert.are.equal(ta, tb)
    a:close() b:close()
    local rc, report, err = T.generate_json(out, "--devices 2 --max-tokens 60")
    assert.are.equal(0, rc, err)
    assert.are.equal(ta, report.text)
  end)
end)

describe("chat templates from GGUF metadata", function()
  it("render tokenizer.chat_template for a GGUF model and for its slice store", function()
    local src = fixture("models/stories260K-gguf/stories260K.gguf")
    local g = gguf.open(src)
    local md = {}
    for _, key in ipairs((function()
      local ks = {}
      for k in pairs(g.metadata) do ks[#ks + 1] = k end
      table.sort(ks)
      return ks
    end)()) do
      md[#md + 1] = { key, g.types[key], g.metadata[key] }
    end
    md[#md + 1] = { "tokenizer.chat_template", "STRING",
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}" }
    local tensors = {}
    for _, name in ipairs(g.order) do
      local x = g.tensors[name]
      local p, n = g:data(name)
      tensors[#tensors + 1] = { name = name, type = x.type, dims = x.dims, data = ffi.string(p, n) }
    end
    g:close()
    local dir = T.tmpdir()
    T.write(dir .. "/chat.gguf", gguf.encode(md, tensors))
    local m = loip.model.open(dir .. "/chat.gguf")
    local msgs = { { role = "user", content = "Tell me a story" } }
    assert.are.equal("<s>[user] Tell me a story\n[assistant]", m.tokenizer:apply_chat_template(msgs, { add_generation_prompt = true }))
    m:close()
    -- a template file instead of the metadata's, still with the GGUF's special tokens
    T.write(dir .. "/t.jinja", "{{ bos_token }}|{{ messages[0].content }}|{{ eos_token }}")
    assert.are.equal("<s>|Tell me a story|</s>", require("loip.text.chat").apply(dir .. "/chat.gguf", msgs,
      { template_file = dir .. "/t.jinja" }))
    assert.are.equal("<s>|Tell me a story|</s>", require("loip.text.chat").apply(src, msgs,
      { template_file = dir .. "/t.jinja" })) -- (stories260K.gguf has no template of its own)
    require("loip.model.slice").write(dir .. "/chat.gguf", dir .. "/store", { quiet = true })
    local s = loip.model.open(dir .. "/store")
    assert.are.equal("<s>[user] Tell me a story\n", s.tokenizer:apply_chat_template(msgs))
    s:close()
    local rc, out, err = T.run(string.format("%s generate --model %s/chat.gguf --chat --prompt 'Hi' --max-tokens 5 --temperature 0 --json",
      T.loip, dir))
    assert.are.equal(0, rc, err)
    assert.is_true(json.decode(out).prompt_tokens > 5)
  end)
end)

describe("GGUF models loip refuses", function()
  local function model_err(md, tensors)
    local path = T.tmpdir() .. "/bad.gguf"
    T.write(path, gguf.encode(md, tensors))
    local ok, err = pcall(loip.model.open, path, { tokenizer = false })
    assert.is_false(ok)
    return err
  end
  local f32 = function(n) return T.f32_bytes((function() local t = {} for i = 1, n do t[i] = 0.01 * i end return t end)()) end
  local base = {
    { "llama.embedding_length", "UINT32", 8 }, { "llama.block_count", "UINT32", 1 },
    { "llama.feed_forward_length", "UINT32", 16 }, { "llama.attention.head_count", "UINT32", 2 },
    { "llama.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-5 },
  }
  local function with(extra)
    local md = {}
    for _, kv in ipairs(base) do md[#md + 1] = kv end
    for _, kv in ipairs(extra) do md[#md + 1] = kv end
    return md
  end
  local embd = { name = "token_embd.weight", type = "F32", dims = { 8, 10 }, data = f32(80) }

  it("names the architecture, the missing key, the missing or unknown tensor", function()
    -- (the supported list is every family's GGUF architectures, sorted: lua/loip/model/families/)
    local supported = table.concat(families.names(families.gguf), ", ")
    for _, a in ipairs({ "llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe" }) do
      assert.truthy((", " .. supported .. ", "):find(", " .. a .. ", ", 1, true), a)
    end
    assert.matches("general.architecture 'gpt2' is not supported %(supported: " .. supported:gsub("%p", "%%%0") .. "%)",
      model_err({ { "general.architecture", "STRING", "gpt2" } }, { embd }))
    assert.matches("metadata llama.feed_forward_length is missing", model_err({ { "general.architecture", "STRING", "llama" },
      { "llama.embedding_length", "UINT32", 8 }, { "llama.block_count", "UINT32", 1 },
      { "llama.attention.head_count", "UINT32", 2 } }, { embd }))
    assert.matches("partial rotary embeddings are not supported", model_err(with({ { "general.architecture", "STRING", "llama" },
      { "llama.rope.dimension_count", "UINT32", 2 } }), { embd }))
    assert.matches("tensor 'blk.0.attn_norm.weight' is missing", model_err(with({ { "general.architecture", "STRING", "llama" } }),
      { embd, { name = "output_norm.weight", type = "F32", dims = { 8 }, data = f32(8) } }))
    assert.matches("tensor 'blk.0.mystery.weight' is not one loip knows", model_err(with({ { "general.architecture", "STRING", "llama" } }),
      { embd, { name = "blk.0.mystery.weight", type = "F32", dims = { 8 }, data = f32(8) } }))
    assert.matches("tensor 'blk.3.attn_norm.weight' is past the model's 1 layers", model_err(with({ { "general.architecture", "STRING", "llama" } }),
      { embd, { name = "blk.3.attn_norm.weight", type = "F32", dims = { 8 }, data = f32(8) } }))
    assert.matches("rope_freqs.weight' holds frequency factors", model_err(with({ { "general.architecture", "STRING", "llama" } }),
      { embd, { name = "rope_freqs.weight", type = "F32", dims = { 2 }, data = T.f32_bytes({ 3, 5 }) } }))
  end)

  it("names a directory with several GGUF files", function()
    local dir = T.tmpdir()
    T.write(dir .. "/a.gguf", "x")
    T.write(dir .. "/b.gguf", "x")
    local ok, err = pcall(loip.model.open, dir)
    assert.is_false(ok)
    assert.matches("holds 2 GGUF files %(a.gguf, b.gguf%): name the one to run", err)
  end)
end)
