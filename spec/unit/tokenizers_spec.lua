-- Hugging Face, tiktoken and SentencePiece tokenizers against references the project did not
-- compute: llama.cpp's test-tokenizer vectors (Qwen2, Llama 3, Llama 2), Meta's Llama 3 test
-- values and SentencePiece 0.1.97's output (models/*/reference). The Qwen2 and
-- Llama 3 tokenizer.json files, Llama 3's vocab.json + merges.txt and Llama 2's HF
-- tokenizer.json are written here the way Hugging Face's converters write them.
local bit = require "bit"
local ffi = require "ffi"
local cjson = require "cjson"
local loip = require "loip"
local T = require "spec.support"
teardown(function() T.cleanup() end) -- the temporary directories made here
local tokenizer = require "loip.text.tokenizer"
local decoder = require "loip.text.tokenizers.decoder"

local C = loip.C

-- ---- helpers ---------------------------------------------------------------------------------

local vectors = T.ggml_vectors

-- Runs every case; asserts all pass, naming those that do not. Returns the pass count.
local function check_vectors(tok, cases, opts)
  local fails, pass = {}, 0
  for _, c in ipairs(cases) do
    local got = table.concat(tok:encode(c.text, opts or { add_special = false }), " ")
    local want = table.concat(c.ids, " ")
    if got == want then pass = pass + 1
    else fails[#fails + 1] = string.format("%q: got %s, want %s", c.text, got, want) end
  end
  assert.are.equal(#cases, pass, table.concat(fails, "\n"))
  return pass
end

local function fixture(rel)
  local p, why = T.fixture_path(rel)
  if not p then pending(why) end
  return p
end

-- UTF-8 of code point cp.
local function utf8(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
  end
  return string.char(0xF0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
    0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

-- Random valid UTF-8 (seeded): ASCII words and punctuation, white space runs, Latin-1,
-- Cyrillic, CJK, Hangul, emoji; with_marks adds combining marks (not NFC-stable).
local function random_text(n, with_marks)
  local ranges = { { 0x20, 0x7E }, { 0x20, 0x7E }, { 0x61, 0x7A }, { 0xA0, 0xFF }, { 0x400, 0x44F },
    { 0x4E00, 0x9FFF }, { 0xAC00, 0xD7A3 }, { 0x1F300, 0x1F64F }, { 0x30, 0x39 } }
  local out = {}
  for i = 1, n do
    local r = math.random(12)
    if r <= 9 then
      local rg = ranges[r]
      out[i] = utf8(math.random(rg[1], rg[2]))
    elseif r == 10 then
      out[i] = ({ " ", "  ", "\n", "\n\n", "\t", " \n " })[math.random(6)]
    elseif r == 11 then
      out[i] = ({ "'s", "'ll", "don't", "```", "...", "<|", "|>" })[math.random(7)]
    else
      out[i] = with_marks and utf8(math.random(0x300, 0x36F)) or "e"
    end
  end
  return table.concat(out)
end

-- The longest prefix of s that does not end inside a character that could still complete.
local function settled_prefix(s)
  for back = 1, math.min(3, #s) do
    local c = s:byte(#s - back + 1)
    if c < 0x80 then return s end
    if c >= 0xC0 then
      return decoder.seq_len(s, #s - back + 1) < 0 and s:sub(1, -back - 1) or s
    end
  end
  return s
end

-- Streaming decode of ids gives decode's text; byte_exact: after each id, exactly the settled
-- prefix of decode(ids[1..i]) has come out (byte-level decoders).
local function check_stream(tok, ids, byte_exact, opts)
  local st = tok:decode_stream(opts)
  local got = {}
  for i, id in ipairs(ids) do
    local piece = st:put(id)
    got[#got + 1] = piece
    if byte_exact then
      local so_far = table.concat(got)
      local partial = {}
      for k = 1, i do partial[k] = ids[k] end
      assert.are.equal(settled_prefix(tok:decode(partial, opts)), so_far)
    end
  end
  got[#got + 1] = st:finish()
  assert.are.equal(tok:decode(ids, opts), table.concat(got))
  return got
end

-- GPT-2's bytes_to_unicode, written out again here.
local b2u = {}
do
  local n = 0
  for b = 0, 255 do
    if (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or (b >= 174 and b <= 255) then
      b2u[b] = utf8(b)
    else
      b2u[b] = utf8(256 + n)
      n = n + 1
    end
  end
end
local function spell(raw) return (raw:gsub(".", function(c) return b2u[c:byte()] end)) end

local S = {} -- fixtures made once

local function qwen_dir() return fixture("models/qwen2-tokenizer") end

-- Qwen2's tokenizer.json as HF writes it (tokenizers 0.19), from vocab.json + merges.txt.
local function qwen_json()
  if S.qwen_json then return S.qwen_json end
  local src = qwen_dir()
  local vocab = cjson.decode(T.read(src .. "/vocab.json"))
  local merges = {}
  for line in T.read(src .. "/merges.txt"):gmatch("([^\n]+)") do
    if not line:find("^#version") then merges[#merges + 1] = line end
  end
  local added = {}
  for _, t in ipairs({ { 151643, "<|endoftext|>" }, { 151644, "<|im_start|>" }, { 151645, "<|im_end|>" } }) do
    added[#added + 1] = { id = t[1], content = t[2], single_word = false, lstrip = false, rstrip = false,
      normalized = false, special = true }
  end
  local bl = { type = "ByteLevel", add_prefix_space = false, trim_offsets = false, use_regex = false }
  local j = {
    version = "1.0", truncation = cjson.null, padding = cjson.null, added_tokens = added,
    normalizer = { type = "NFC" },
    pre_tokenizer = { type = "Sequence", pretokenizers = {
      { type = "Split", pattern = { Regex = [[(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+]] },
        behavior = "Isolated", invert = false },
      bl } },
    post_processor = bl, decoder = bl,
    model = { type = "BPE", dropout = cjson.null, unk_token = cjson.null, continuing_subword_prefix = "",
      end_of_word_suffix = "", fuse_unk = false, byte_fallback = false, ignore_merges = false,
      vocab = vocab, merges = merges },
  }
  local dir = T.tmpdir()
  T.write(dir .. "/tokenizer.json", cjson.encode(j))
  T.write(dir .. "/tokenizer_config.json", T.read(src .. "/tokenizer_config.json"))
  S.qwen_json = dir
  return dir
end

local function llama3_tiktoken()
  if S.llama3 == nil then S.llama3 = tokenizer.open(fixture("models/llama3-tokenizer")) end
  return S.llama3
end

-- Llama 3 as vocab.json + merges.txt and as tokenizer.json, derived from the tiktoken ranks as
-- transformers' TikTokenConverter does: every split of a token into two tokens is a merge,
-- ordered by the token's rank, then by the ranks of the two parts.
local function llama3_hf()
  if S.llama3_hf then return S.llama3_hf end
  local tik = llama3_tiktoken()
  local n = 128000
  local raw, rank, spelled = {}, {}, {}
  for id = 0, n - 1 do
    local p = tik:id_to_token(id)
    raw[id], rank[p] = p, id
  end
  local vocab = {}
  for id = 0, n - 1 do
    spelled[id] = spell(raw[id])
    vocab[spelled[id]] = id
  end
  local merges, lines = {}, { "#version: 0.2" }
  for id = 0, n - 1 do
    local p = raw[id]
    local at = #merges
    for k = 1, #p - 1 do
      local a, b = rank[p:sub(1, k)], rank[p:sub(k + 1)]
      if a and b then merges[#merges + 1] = { a, b } end
    end
    if #merges - at > 1 then
      local loc = {}
      for i = at + 1, #merges do loc[#loc + 1] = merges[i] end
      table.sort(loc, function(x, y) return x[1] < y[1] or (x[1] == y[1] and x[2] < y[2]) end)
      for i, m in ipairs(loc) do merges[at + i] = m end
    end
  end
  local pairs_json = {}
  for i, m in ipairs(merges) do
    pairs_json[i] = { spelled[m[1]], spelled[m[2]] }
    lines[i + 1] = spelled[m[1]] .. " " .. spelled[m[2]]
  end
  local specials = cjson.decode(T.read(fixture("models/llama3-tokenizer/special_tokens.json"))).special_tokens
  local added, decoder_cfg = {}, {}
  for content, id in pairs(specials) do
    added[#added + 1] = { id = id, content = content, single_word = false, lstrip = false, rstrip = false,
      normalized = false, special = true }
    decoder_cfg[tostring(id)] = added[#added]
  end
  table.sort(added, function(a, b) return a.id < b.id end)
  local config = cjson.encode({ bos_token = "<|begin_of_text|>", eos_token = "<|end_of_text|>",
    tokenizer_class = "PreTrainedTokenizerFast", added_tokens_decoder = decoder_cfg })

  local split = T.tmpdir()
  T.write(split .. "/vocab.json", cjson.encode(vocab))
  T.write(split .. "/merges.txt", table.concat(lines, "\n") .. "\n")
  T.write(split .. "/tokenizer_config.json", config)

  local bl = { type = "ByteLevel", add_prefix_space = false, trim_offsets = true, use_regex = false }
  local j = {
    version = "1.0", added_tokens = added, normalizer = cjson.null,
    pre_tokenizer = { type = "Sequence", pretokenizers = {
      { type = "Split", pattern = { Regex = [[(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+]] },
        behavior = "Isolated", invert = false },
      bl } },
    post_processor = { type = "Sequence", processors = {
      { type = "ByteLevel", add_prefix_space = true, trim_offsets = false, use_regex = true },
      { type = "TemplateProcessing",
        single = { { SpecialToken = { id = "<|begin_of_text|>", type_id = 0 } }, { Sequence = { id = "A", type_id = 0 } } },
        pair = { { SpecialToken = { id = "<|begin_of_text|>", type_id = 0 } }, { Sequence = { id = "A", type_id = 0 } },
          { SpecialToken = { id = "<|begin_of_text|>", type_id = 1 } }, { Sequence = { id = "B", type_id = 1 } } },
        special_tokens = { ["<|begin_of_text|>"] = { id = "<|begin_of_text|>", ids = { 128000 }, tokens = { "<|begin_of_text|>" } } } } } },
    decoder = { type = "ByteLevel", add_prefix_space = true, trim_offsets = true, use_regex = true },
    model = { type = "BPE", dropout = cjson.null, unk_token = cjson.null, continuing_subword_prefix = cjson.null,
      end_of_word_suffix = cjson.null, fuse_unk = false, byte_fallback = false, ignore_merges = true,
      vocab = vocab, merges = pairs_json },
  }
  local dir = T.tmpdir()
  T.write(dir .. "/tokenizer.json", cjson.encode(j))
  T.write(dir .. "/tokenizer_config.json", config)
  local tokens = {}
  for id = 0, n - 1 do tokens[id + 1] = spelled[id] end
  for content, id in pairs(specials) do tokens[id + 1] = content end
  table.remove(lines, 1) -- (the #version line)
  S.llama3_hf = { split = split, json = dir, n_merges = #merges, tokens = tokens, merge_lines = lines, n_base = n }
  return S.llama3_hf
end

-- Llama 2's tokenizer.json as transformers' LlamaConverter writes it (legacy): SentencePiece
-- pieces and scores; every split of a piece into two pieces is a merge, ordered by the
-- piece's score (highest first), then by the ids of the two parts.
local function llama2_json()
  if S.llama2_json then return S.llama2_json end
  local path = fixture("models/llama2-tokenizer/tokenizer.model")
  local out = ffi.new("loip_spm *[1]")
  assert.are.equal(0, C.loip_spm_open(path, out))
  local m = ffi.gc(out[0], C.loip_spm_free)
  local n = C.loip_spm_size(m)
  local pp, len, score, ty = ffi.new("const char *[1]"), ffi.new("int32_t[1]"), ffi.new("float[1]"), ffi.new("int32_t[1]")
  local pieces, scores, vocab = {}, {}, {}
  for id = 0, n - 1 do
    C.loip_spm_piece(m, id, pp, len, score, ty)
    pieces[id], scores[id] = ffi.string(pp[0], len[0]), score[0]
    vocab[pieces[id]] = id
  end
  local merges = {}
  for id = 0, n - 1 do
    local p, loc = pieces[id], {}
    local k = 1
    while k < #p do
      k = k + 1
      while k <= #p and p:byte(k) >= 0x80 and p:byte(k) < 0xC0 do k = k + 1 end
      if k > #p then break end
      local a, b = vocab[p:sub(1, k - 1)], vocab[p:sub(k)]
      if a and b then loc[#loc + 1] = { a, b, id } end
    end
    table.sort(loc, function(x, y) return x[1] < y[1] or (x[1] == y[1] and x[2] < y[2]) end)
    for _, e in ipairs(loc) do merges[#merges + 1] = e end
  end
  for i, e in ipairs(merges) do e[4] = i end
  table.sort(merges, function(x, y)
    if scores[x[3]] ~= scores[y[3]] then return scores[x[3]] > scores[y[3]] end
    return x[4] < y[4]
  end)
  local strs = {}
  for i, e in ipairs(merges) do strs[i] = pieces[e[1]] .. " " .. pieces[e[2]] end
  local added = {}
  for _, t in ipairs({ { 0, "<unk>" }, { 1, "<s>" }, { 2, "</s>" } }) do
    added[#added + 1] = { id = t[1], content = t[2], single_word = false, lstrip = false, rstrip = false,
      normalized = false, special = true }
  end
  local j = {
    version = "1.0", added_tokens = added,
    normalizer = { type = "Sequence", normalizers = {
      { type = "Prepend", prepend = "\226\150\129" },
      { type = "Replace", pattern = { String = " " }, content = "\226\150\129" } } },
    pre_tokenizer = cjson.null,
    post_processor = { type = "TemplateProcessing",
      single = { { SpecialToken = { id = "<s>", type_id = 0 } }, { Sequence = { id = "A", type_id = 0 } } },
      pair = { { SpecialToken = { id = "<s>", type_id = 0 } }, { Sequence = { id = "A", type_id = 0 } },
        { SpecialToken = { id = "<s>", type_id = 1 } }, { Sequence = { id = "B", type_id = 1 } } },
      special_tokens = { ["<s>"] = { id = "<s>", ids = { 1 }, tokens = { "<s>" } } } },
    decoder = { type = "Sequence", decoders = {
      { type = "Replace", pattern = { String = "\226\150\129" }, content = " " },
      { type = "ByteFallback" }, { type = "Fuse" },
      { type = "Strip", content = " ", start = 1, stop = 0 } } },
    model = { type = "BPE", dropout = cjson.null, unk_token = "<unk>", continuing_subword_prefix = cjson.null,
      end_of_word_suffix = cjson.null, fuse_unk = true, byte_fallback = true, vocab = vocab, merges = strs },
  }
  local dir = T.tmpdir()
  T.write(dir .. "/tokenizer.json", cjson.encode(j))
  S.llama2_json = dir
  return dir
end

-- ---- Qwen2 -----------------------------------------------------------------------------------

describe("Qwen2 byte-level BPE", function()
  after_each(function() collectgarbage() collectgarbage() end)

  local function cases()
    local d = qwen_dir()
    return vectors(d .. "/reference/ggml-vocab-qwen2.gguf.inp", d .. "/reference/ggml-vocab-qwen2.gguf.out")
  end

  it("passes llama.cpp's 46 vectors through vocab.json + merges.txt", function()
    local tok = tokenizer.open(qwen_dir())
    assert.are.equal("hf-split", tok.kind)
    assert.are.equal("qwen2", tok.pretokenizer)
    assert.are.equal(46, check_vectors(tok, cases()))
  end)

  it("passes them through a tokenizer.json built from those files", function()
    local tok = tokenizer.open(qwen_json())
    assert.are.equal("hf", tok.kind)
    assert.are.equal(151646, tok.vocab_size)
    assert.are.equal(46, check_vectors(tok, cases()))
  end)

  it("gives back every test string and random text (decode(encode(s)) == s)", function()
    local tok = tokenizer.open(qwen_json())
    for _, c in ipairs(cases()) do assert.are.equal(c.text, tok:decode(tok:encode(c.text))) end
    math.randomseed(7)
    for _ = 1, 60 do
      local s = random_text(math.random(1, 80))
      assert.are.equal(s, tok:decode(tok:encode(s)))
    end
  end)

  it("normalizes to NFC first", function()
    local tok = tokenizer.open(qwen_dir())
    assert.are.same(tok:encode("caf\195\169"), tok:encode("cafe\204\129"))
    assert.are.equal("caf\195\169", tok:decode(tok:encode("cafe\204\129")))
  end)

  it("encodes malformed UTF-8 as its raw bytes and decodes them back", function()
    local tok = tokenizer.open(qwen_dir())
    local s = "ab\255\254c\195(\226\130 \240\159\152"
    local ids = tok:encode(s)
    assert.are.equal(s, tok:decode(ids))
    -- 0xFF alone is its byte token (GPT-2 spelling "ÿ").
    assert.are.same({ tok:token_to_id("\195\191") }, tok:encode("\255"))
  end)

  it("matches special tokens before pre-tokenizing, and names them", function()
    local tok = tokenizer.open(qwen_dir())
    local ids = tok:encode("<|im_start|>user\nhi<|im_end|>")
    assert.are.same({ 151644, 872, 198, 6023, 151645 }, ids)
    assert.are.equal("<|im_start|>user\nhi<|im_end|>", tok:decode(ids))
    assert.are.equal("user\nhi", tok:decode(ids, { skip_special = true }))
    local as_text = tok:encode("<|im_start|>", { parse_special = false })
    assert.is_true(#as_text > 1)
    assert.are.equal("<|im_start|>", tok:decode(as_text))
    assert.are.same({ 9707 }, tok:encode("Hello")) -- no BOS for Qwen2
    assert.is_nil(tok.bos_token)
    assert.are.equal("<|im_end|>", tok.eos_token)
    assert.are.equal(151645, tok.eos_id)
    assert.are.equal(151645, tok:token_to_id("<|im_end|>"))
    assert.are.equal("\196\160", tok:id_to_token(220)) -- "Ġ"
    assert.are.equal(220, tok:token_to_id("\196\160"))
    assert.are.equal("Hello", tok:id_to_token(9707))
    assert.is_true(tok:is_special(151643))
    tok:close()
    tok:close()
  end)

  it("streams complete UTF-8 only, and exactly decode's text", function()
    local tok = tokenizer.open(qwen_dir())
    for _, c in ipairs(cases()) do check_stream(tok, tok:encode(c.text), true) end
    -- A character split over two tokens comes out once both are in.
    local ids = { tok:token_to_id(spell("\228\189")), tok:token_to_id(spell("\160")) }
    local st = tok:decode_stream()
    assert.are.equal("", st:put(ids[1]))
    assert.are.equal("\228\189\160", st:put(ids[2]))
    assert.are.equal("", st:finish())
  end)
end)

-- ---- Llama 3 ---------------------------------------------------------------------------------

describe("Llama 3 byte-level BPE", function()
  after_each(function() collectgarbage() collectgarbage() end)

  local function cases()
    local d = fixture("models/llama3-tokenizer")
    return vectors(d .. "/reference/ggml-vocab-llama-bpe.gguf.inp", d .. "/reference/ggml-vocab-llama-bpe.gguf.out")
  end

  it("passes llama.cpp's 46 vectors through the tiktoken file", function()
    local tok = llama3_tiktoken()
    assert.are.equal("tiktoken", tok.kind)
    assert.are.equal(128256, tok.vocab_size)
    assert.are.equal(46, check_vectors(tok, cases()))
  end)

  it("passes them through a GGUF vocabulary (gpt2, pre llama-bpe) as llama.cpp's converter writes it", function()
    local f = llama3_hf()
    local types = {}
    for i = 1, #f.tokens do types[i] = i > f.n_base and 3 or 1 end
    local path = T.tmpdir() .. "/llama3-vocab.gguf"
    T.write(path, require("loip.model.gguf").encode({
      { "tokenizer.ggml.model", "STRING", "gpt2" }, { "tokenizer.ggml.pre", "STRING", "llama-bpe" },
      { "tokenizer.ggml.tokens", "ARRAY[STRING]", f.tokens }, { "tokenizer.ggml.token_type", "ARRAY[INT32]", types },
      { "tokenizer.ggml.merges", "ARRAY[STRING]", f.merge_lines },
      { "tokenizer.ggml.bos_token_id", "UINT32", 128000 }, { "tokenizer.ggml.eos_token_id", "UINT32", 128001 },
      { "tokenizer.ggml.eot_token_id", "UINT32", 128009 }, { "tokenizer.ggml.add_bos_token", "BOOL", true },
    }))
    local tok = tokenizer.open_file(path)
    assert.are.equal("gguf", tok.kind)
    assert.are.equal("llama3", tok.pretokenizer)
    assert.are.equal(128256, tok.vocab_size)
    assert.are.equal(46, check_vectors(tok, cases()))
    for _, c in ipairs(cases()) do assert.are.equal(c.text, tok:decode(tok:encode(c.text, { add_special = false }))) end
    assert.are.same({ 128000, 2028, 374, 264, 1296, 11914, 13 }, tok:encode("This is a test sentence."))
    assert.are.same({ 128001, 128009 }, tok.stop_ids)
    tok:close()
  end)

  it("passes them through vocab.json + merges.txt and tokenizer.json derived from it", function()
    local f = llama3_hf()
    local split = tokenizer.open(f.split)
    assert.are.equal("llama3", split.pretokenizer)
    assert.are.equal(46, check_vectors(split, cases()))
    local tj = tokenizer.open(f.json)
    assert.are.equal("hf", tj.kind)
    assert.are.equal(46, check_vectors(tj, cases()))
    assert.are.equal(f.n_merges, tonumber(C.loip_bpe_merge_count(tj.bpe)))
    assert.are.equal(tonumber(C.loip_bpe_merge_count(tj.bpe)), tonumber(C.loip_bpe_merge_count(llama3_tiktoken().bpe)))
    for _, c in ipairs(cases()) do
      assert.are.equal(c.text, tj:decode(tj:encode(c.text, { add_special = false })))
      assert.are.equal(c.text, split:decode(split:encode(c.text)))
    end
    -- BOS from the post-processor, as Meta's encode(bos=True) gives it.
    assert.are.same({ 128000, 2028, 374, 264, 1296, 11914, 13 }, tj:encode("This is a test sentence."))
    assert.are.equal("<|begin_of_text|>", tj.bos_token)
  end)

  it("passes Meta's test_tokenizer.py values", function()
    local tok = llama3_tiktoken()
    local ref = cjson.decode(T.read(fixture("models/llama3-tokenizer/reference/meta_test_vectors.json")))
    local function header(role)
      local ids = { tok:token_to_id("<|start_header_id|>") }
      for _, id in ipairs(tok:encode(role, { add_special = false })) do ids[#ids + 1] = id end
      ids[#ids + 1] = tok:token_to_id("<|end_header_id|>")
      for _, id in ipairs(tok:encode("\n\n", { add_special = false })) do ids[#ids + 1] = id end
      return ids
    end
    local function message(msg)
      local ids = header(msg.role)
      for _, id in ipairs(tok:encode(msg.content, { add_special = false })) do ids[#ids + 1] = id end
      ids[#ids + 1] = tok:token_to_id("<|eot_id|>")
      return ids
    end
    local n = 0
    for _, c in ipairs(ref.cases) do
      if c.kind == "special_token_id" then
        assert.are.equal(c.id, tok:token_to_id(c.token))
      elseif c.kind == "encode" then
        assert.are.same(c.ids, tok:encode(c.text, { add_special = c.bos, eos = c.eos }))
      elseif c.kind == "decode" then
        assert.are.equal(c.text, tok:decode(c.ids))
      elseif c.kind == "encode_message" then
        assert.are.same(c.ids, message(c.message))
        -- The same text, written with its special tokens, encodes the same.
        local text = "<|start_header_id|>" .. c.message.role .. "<|end_header_id|>\n\n" .. c.message.content .. "<|eot_id|>"
        assert.are.same(c.ids, tok:encode(text, { add_special = false }))
      elseif c.kind == "encode_dialog_prompt" then
        local ids = { tok.bos_id }
        for _, m in ipairs(c.dialog) do for _, id in ipairs(message(m)) do ids[#ids + 1] = id end end
        for _, id in ipairs(header("assistant")) do ids[#ids + 1] = id end
        assert.are.same(c.ids, ids)
      end
      n = n + 1
    end
    assert.are.equal(#ref.cases, n)
    assert.are.equal("<|begin_of_text|>", tok.bos_token)
    assert.are.same({ 128001, 128009 }, tok.stop_ids)
  end)

  it("has Meta's special tokens, as special_tokens.json lists them", function()
    local want = cjson.decode(T.read(fixture("models/llama3-tokenizer/special_tokens.json"))).special_tokens
    assert.are.same(want, require("loip.text.tokenizers.tiktoken").llama3_special_tokens(128000))
  end)

  it("gives back every test string, random text and raw bytes", function()
    local tok = llama3_tiktoken()
    for _, c in ipairs(cases()) do
      assert.are.equal(c.text, tok:decode(tok:encode(c.text), { skip_special = true }))
      check_stream(tok, tok:encode(c.text), true)
    end
    math.randomseed(11)
    for _ = 1, 60 do
      local s = random_text(math.random(1, 80), true)
      local ids = tok:encode(s, { add_special = false })
      assert.are.equal(s, tok:decode(ids))
    end
    local bytes = {}
    for i = 1, 200 do bytes[i] = string.char(math.random(0, 255)) end
    local s = table.concat(bytes)
    local ids = tok:encode(s, { add_special = false })
    assert.are.equal(s, tok:decode(ids))
    check_stream(tok, ids, true)
  end)
end)

-- ---- Llama 2 (SentencePiece) -----------------------------------------------------------------

describe("Llama 2 SentencePiece BPE", function()
  after_each(function() collectgarbage() collectgarbage() end)

  local function reference()
    return cjson.decode(T.read(fixture("models/llama2-tokenizer/reference/sentencepiece_reference.json"))).cases
  end
  local function cases()
    local d = fixture("models/llama2-tokenizer")
    return vectors(d .. "/reference/ggml-vocab-llama-spm.gguf.inp", d .. "/reference/ggml-vocab-llama-spm.gguf.out")
  end
  local plain = { add_special = false, parse_special = false }

  it("reproduces SentencePiece through tokenizer.model (57 cases) and llama.cpp (46)", function()
    local tok = tokenizer.open_file(fixture("models/llama2-tokenizer/tokenizer.model"))
    assert.are.equal("sentencepiece", tok.kind)
    assert.are.equal(32000, tok.vocab_size)
    local ref = reference()
    assert.are.equal(#ref, check_vectors(tok, ref, plain))
    for _, c in ipairs(ref) do
      assert.are.equal(c.decoded, tok:decode(c.ids))
      local with_bos = tok:encode(c.text, { parse_special = false })
      assert.are.equal(1, with_bos[1])
      assert.are.equal(#c.ids + 1, #with_bos)
      check_stream(tok, c.ids)
    end
    assert.are.equal(46, check_vectors(tok, cases(), plain))
    assert.are.equal("<s>", tok.bos_token)
    assert.are.equal("</s>", tok.eos_token)
    -- Special-token text is the special token unless parse_special = false.
    assert.are.same({ 1, 1, 15043 }, tok:encode("<s>Hello"))
  end)

  it("reproduces it through llama2.c's tokenizer.bin where run.c agrees", function()
    local path = fixture("models/llama2-tokenizer/tokenizer.bin")
    local tok = tokenizer.open_file(path)
    assert.are.equal("llama2c", tok.kind)
    local n = 0
    for _, c in ipairs(reference()) do
      if c.runc_encode_matches == true then
        local want = { 1 }
        for _, id in ipairs(c.ids) do want[#want + 1] = id end
        assert.are.same(want, tok:encode(c.text))
        n = n + 1
      end
    end
    assert.are.equal(56, n)
  end)

  it("reproduces it through an HF tokenizer.json (Prepend, Replace, ByteFallback, Fuse, Strip)", function()
    local tok = tokenizer.open(llama2_json())
    assert.are.equal("hf", tok.kind)
    local ref = reference()
    assert.are.equal(#ref, check_vectors(tok, ref, plain))
    assert.are.equal(46, check_vectors(tok, cases(), plain))
    for _, c in ipairs(ref) do
      assert.are.equal(c.decoded, tok:decode(c.ids))
      check_stream(tok, c.ids)
    end
    assert.are.same({ 1, 15043 }, tok:encode("Hello"))
    -- HF's decode shows special tokens and the decoders see them (the Strip then has no space
    -- to take): "<s> Hello".
    assert.are.equal("<s> Hello", tok:decode({ 1, 15043 }))
    assert.are.equal("Hello", tok:decode({ 1, 15043 }, { skip_special = true }))
  end)

  it("replaces malformed UTF-8 with U+FFFD before encoding, as SentencePiece does", function()
    local tok = tokenizer.open_file(fixture("models/llama2-tokenizer/tokenizer.model"))
    assert.are.same(tok:encode("a\239\191\189b"), tok:encode("a\255b"))
  end)

  it("holds byte-fallback pieces back until their character is complete", function()
    local tok = tokenizer.open_file(fixture("models/llama2-tokenizer/tokenizer.model"))
    local ids = tok:encode("\240\159\154\128 go", { add_special = false }) -- U+1F680 has no piece
    local st = tok:decode_stream()
    local out = {}
    for i, id in ipairs(ids) do
      out[i] = st:put(id)
      if i <= 5 then assert.are.equal("", out[i]) end -- "▁", then 4 byte pieces
    end
    assert.are.equal("\240\159\154\128 go", table.concat(out) .. st:finish())
    assert.are.equal("\240", tok:piece_text(1, ids[2])) -- the raw byte, as llama2c gives it
  end)
end)

-- ---- pieces in C -----------------------------------------------------------------------------

describe("tokenizer parts", function()
  it("normalizes to NFC (composition, ordering, Hangul, singletons, exclusions)", function()
    local n, same = ffi.new("size_t[1]"), ffi.new("int32_t[1]")
    local buf = ffi.new("char[64]")
    local function nfc(s)
      assert.are.equal(0, C.loip_utf8_nfc(s, #s, buf, 64, n, same))
      return same[0] == 1 and s or ffi.string(buf, n[0])
    end
    local function hex(h) return (h:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end)) end
    -- Expected values: Python's unicodedata.normalize("NFC", ...).
    assert.are.equal(hex("c3a9"), nfc(hex("65cc81")))
    assert.are.equal(hex("eab080"), nfc(hex("e18480e185a1")))
    assert.are.equal(hex("eab081"), nfc(hex("e18480e185a1e186a8")))
    assert.are.equal(hex("c385"), nfc(hex("e284ab")))
    assert.are.equal(hex("e1baa1cc81"), nfc(hex("61cc81cca3")))
    assert.are.equal(hex("e0a495e0a4bc"), nfc(hex("e0a598")))
    assert.are.equal("plain ascii", nfc("plain ascii"))
    assert.are.equal(1, same[0])
    assert.are.equal("\255\195\169", nfc("\255e\204\129"))
  end)

  it("splits with each of HF's delimiter behaviors", function()
    local bpe = require "loip.text.tokenizers.bpe"
    local function split(behavior, flags)
      local p = bpe.pretok({ { pattern = "-", behavior = behavior, flags = bit.bor(C.LOIP_SPLIT_LITERAL, flags or 0) } }, "test")
      local s = "the-final--countdown"
      local b, n = ffi.new("int32_t[32]"), ffi.new("int32_t[1]")
      assert.are.equal(0, C.loip_pretok_split(p, s, #s, b, 16, n))
      local out = {}
      for i = 0, n[0] - 1 do out[#out + 1] = s:sub(b[2 * i] + 1, b[2 * i + 1]) end
      return out
    end
    -- HF's documentation of SplitDelimiterBehavior, on "the-final--countdown".
    assert.are.same({ "the", "final", "countdown" }, split(C.LOIP_SPLIT_REMOVED))
    assert.are.same({ "the", "-", "final", "-", "-", "countdown" }, split(C.LOIP_SPLIT_ISOLATED))
    assert.are.same({ "the-", "final-", "-", "countdown" }, split(C.LOIP_SPLIT_MERGED_WITH_PREVIOUS))
    assert.are.same({ "the", "-final", "-", "-countdown" }, split(C.LOIP_SPLIT_MERGED_WITH_NEXT))
    assert.are.same({ "the", "-", "final", "--", "countdown" }, split(C.LOIP_SPLIT_CONTIGUOUS))
    assert.are.same({ "-", "-", "-" }, split(C.LOIP_SPLIT_REMOVED, C.LOIP_SPLIT_INVERT))
  end)
end)
