-- o200k_harmony, gpt-oss's tokenizer, on the whole of OpenAI's o200k_base.tiktoken
-- (models/o200k-harmony; its README says where the file came from and how it was checked):
-- o200k_base's pre-tokenizer regex (bpe.patterns.o200k) against Python's `regex` module with
-- tiktoken's pattern; the tiktoken reader with the harmony special tokens against
-- openai/harmony's token-id test vectors and against js-tiktoken's ids for varied text
-- (js_tiktoken_vectors.json); then the same vocabulary as gpt-oss ships it in tokenizer.json
-- and as llama.cpp's converter writes it into a GGUF (tokenizer.ggml.pre "gpt-4o"), with the
-- merges Hugging Face's tiktoken converter derives (spec/support/o200k.lua), against the same ids.
local ffi = require "ffi"
local cjson = require "cjson"
local loip = require "loip"
local T = require "spec.support"
local bpe = require "loip.text.tokenizers.bpe"
local tiktoken = require "loip.text.tokenizers.tiktoken"
local tokenizer = require "loip.text.tokenizer"
local o200k_forms = require "spec.support.o200k"
local C = loip.C

local function fixture(rel)
  local p, why = T.fixture_path(rel)
  if not p then return nil, why end
  return cjson.decode(T.read(p)), p:match("^(.*)/[^/]*$")
end

-- the whole vocabulary, opened once for the file (0.3 s)
local shared
local function o200k(path)
  shared = shared or tiktoken.open(path)
  return shared
end
teardown(function()
  if shared then shared:close() end
  T.cleanup()
end)

-- the pieces the pre-tokenizer cuts s into
local function pieces(pattern, s)
  local p = bpe.pretok({ { pattern = pattern } }, "o200k")
  local cap = #s + 1
  local b, n = ffi.new("int32_t[?]", 2 * cap), ffi.new("int32_t[1]")
  assert.are.equal(0, C.loip_pretok_split(p, s, #s, b, cap, n))
  local out = {}
  for i = 0, n[0] - 1 do out[#out + 1] = s:sub(b[2 * i] + 1, b[2 * i + 1]) end
  return out
end

-- Every vector encodes to its ids (special tokens as tokens where c.special ~= false) and its
-- ids decode to its text; the failures named together. Returns the number of ids checked.
local function check(tok, vectors, what)
  local fails, n = {}, 0
  for _, c in ipairs(vectors) do
    local got = table.concat(tok:encode(c.text, { parse_special = c.special ~= false }), " ")
    local want = table.concat(c.ids, " ")
    if got ~= want then fails[#fails + 1] = string.format("%s %s: got %s, want %s", what, c.name, got, want) end
    local back = tok:decode(c.ids)
    if back ~= c.text then fails[#fails + 1] = string.format("%s %s: decodes to %q", what, c.name, back) end
    n = n + #c.ids
  end
  assert.are.equal("", table.concat(fails, "\n"))
  return n
end

describe("o200k_harmony", function()
  after_each(function() collectgarbage() collectgarbage() end)

  local v, dir = fixture("models/o200k-harmony/vectors.json")
  local js, why = fixture("models/o200k-harmony/js_tiktoken_vectors.json")
  local ranks, why2 = T.fixture_path("models/o200k-harmony/o200k_base.tiktoken")
  if not v or not js or not ranks then
    it("needs its fixture", function() pending(not v and dir or why or why2) end)
    return
  end
  it("has tiktoken's o200k regex, byte for byte", function()
    assert.are.equal(v.pattern, bpe.patterns.o200k)
    assert.are_not.equal(bpe.patterns.llama3, bpe.patterns.o200k) -- (cl100k's, which Llama 3 took)
  end)

  it("cuts text into the pieces Python's regex cuts it into (" .. #v.pretokenize .. " cases)", function()
    for _, c in ipairs(v.pretokenize) do
      assert.are.same(c.pieces, pieces(bpe.patterns.o200k, c.text), c.text)
    end
    -- where o200k and cl100k differ: case changes, contractions, "/" after punctuation
    assert.are.same({ "camel", "Case" }, pieces(bpe.patterns.o200k, "camelCase"))
    assert.are.same({ "camelCase" }, pieces(bpe.patterns.llama3, "camelCase"))
    assert.are.same({ "isn't" }, pieces(bpe.patterns.o200k, "isn't"))
    assert.are.same({ "isn", "'t" }, pieces(bpe.patterns.llama3, "isn't"))
  end)

  it("is OpenAI's o200k_base: 199,998 ranks, taken for o200k_harmony by their count", function()
    local sha = require("loip.runtime.files").sha256_file(ranks)
    assert.are.equal("446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d", sha) -- (the hash tiktoken checks)
    local tok = o200k(ranks)
    assert.are.equal("tiktoken", tok.kind)
    assert.are.equal("o200k", tok.pretokenizer)
    assert.are.equal("o200k_harmony", tok.encoding)
    assert.are.equal(201088, tok.vocab_size)
    assert.is_false(T.exists(dir .. "/special_tokens.json")) -- (the count alone names the encoding)
  end)

  it("tokenizes harmony's test vectors to their ids, and back", function()
    local tok = o200k(ranks)
    assert.are.equal(4, #v.vectors)
    assert.are.equal(2 + 1 + 35 + 39, check(tok, v.vectors, "harmony"))
    -- test_simple_tool_call whole: "=lookup" is one pre-token and two tokens, only merges give
    assert.are.same({ 316, 28, 29712, 170154, 3490 }, tok:encode(" to=lookup_weather code"))
  end)

  it("tokenizes varied text to js-tiktoken's ids, and back (" .. #js.vectors .. " texts)", function()
    local tok = o200k(ranks)
    local long, special, plain = 0, 0, 0
    for _, c in ipairs(js.vectors) do
      if #c.text >= 1000 then long = long + 1 end
      if c.special then special = special + 1 else plain = plain + 1 end
    end
    assert.is_true(#js.vectors >= 30 and long >= 2 and special >= 3 and plain >= 25)
    assert.is_true(check(tok, js.vectors, "js-tiktoken") > 4000)
  end)

  it("has the harmony special tokens at their ids, <|return|> and <|call|> ending a generation", function()
    local tok = o200k(ranks)
    local want = { ["<|startoftext|>"] = 199998, ["<|endoftext|>"] = 199999, ["<|reserved_200000|>"] = 200000,
      ["<|reserved_200001|>"] = 200001, ["<|return|>"] = 200002, ["<|constrain|>"] = 200003, ["<|reserved_200004|>"] = 200004,
      ["<|channel|>"] = 200005, ["<|start|>"] = 200006, ["<|end|>"] = 200007, ["<|message|>"] = 200008,
      ["<|reserved_200009|>"] = 200009, ["<|reserved_200011|>"] = 200011, ["<|call|>"] = 200012,
      ["<|reserved_200013|>"] = 200013, ["<|endofprompt|>"] = 200018, ["<|reserved_201087|>"] = 201087 }
    -- the message markers are text the model writes (a grammar may ask for them), as llama.cpp has them
    local text = { ["<|start|>"] = true, ["<|channel|>"] = true, ["<|message|>"] = true, ["<|constrain|>"] = true, ["<|end|>"] = true }
    for name, id in pairs(want) do
      assert.are.equal(id, tok:token_to_id(name), name)
      assert.are.equal(name, tok:id_to_token(id))
      assert.are.equal(not text[name], tok:is_special(id), name)
    end
    local grammar = require "loip.text.grammar" -- a grammar asks for them as the tokens themselves
    local m = grammar.compile('root ::= "<|start|>hello"', "test"):matcher(grammar.vocab(tok))
    assert.is_true(m:accept(200006))
    assert.is_true(m:accept(24912))
    assert.is_true(m:can_end())
    assert.is_nil(tok:token_to_id("<|reserved_200018|>"))
    assert.is_nil(tok:id_to_token(201088))
    assert.are.same({ 200002, 200012, 199999 }, tok.stop_ids) -- not <|end|>: it ends a message, not the answer
    assert.are.same({ 199998, 200002 }, { tok.bos_id, tok.eos_id })
    assert.are.same({ 24912, 2375 }, tok:encode("hello world")) -- no BOS in front
    -- special tokens written in text are text when parse_special is false
    local plain = tok:encode("<|start|>", { parse_special = false })
    assert.are_not.same({ 200006 }, plain)
    assert.are.same({ 27, 91, 5236, 91, 29 }, plain) -- "<", "|", "start", "|", ">"
    assert.are.equal("<|start|>", tok:decode(plain))
  end)

  it("is a gpt-oss directory's tokenizer.model; an encoding it does not know is an error naming the file", function()
    local d = T.tmpdir()
    local abs = ranks:sub(1, 1) == "/" and ranks or os.getenv("PWD") .. "/" .. ranks
    assert(os.execute(string.format("ln -s '%s' '%s/tokenizer.model'", abs, d)) == 0)
    local tok = tokenizer.open(d)
    assert.are.equal("tiktoken", tok.kind)
    assert.are.equal("o200k_harmony", tok.encoding)
    assert.are.same({ 200006, 24912, 2375, 200007 }, tok:encode("<|start|>hello world<|end|>"))
    tok:close()
    T.write(d .. "/special_tokens.json", cjson.encode({ encoding = "p50k" }))
    local ok, err = pcall(tokenizer.open, d)
    assert.is_false(ok)
    assert.matches("special_tokens.json: \"encoding\" is 'p50k', not an encoding loip knows", err, 1, true)
  end)

  -- gpt-oss's tokenizer.json (Split by o200k's regex, ByteLevel, BPE with the converter's merges
  -- and ignore_merges, the harmony added tokens), and the GGUF llama.cpp's converter makes of it
  describe("as gpt-oss's tokenizer.json and llama.cpp's GGUF", function()
    local spelled, merges
    local function vocab()
      if not spelled then spelled, merges = o200k_forms.hf_vocab(o200k(ranks)) end
      return spelled, merges
    end

    it("derives 446,189 merges from the ranks, the first that of rank 256", function()
      local _, m = vocab()
      assert.are.equal(446189, #m)
      assert.are.equal(#m, tonumber(C.loip_bpe_merge_count(o200k(ranks).bpe))) -- (as the C reader derives them)
      assert.are.equal("Ġ Ġ", m[1]) -- rank 256 is "  ", from " " and " "
    end)

    it("reads the tokenizer.json form to the same ids", function()
      local sp, m = vocab()
      local map, added = {}, {}
      for id = 0, 199997 do map[sp[id]] = id end
      for name, id in pairs(tiktoken.o200k_harmony_special_tokens()) do
        added[#added + 1] = { id = id, content = name, single_word = false, lstrip = false, rstrip = false, normalized = false, special = true }
      end
      table.sort(added, function(a, b) return a.id < b.id end)
      local j = { version = "1.0", added_tokens = added, normalizer = cjson.null, post_processor = cjson.null,
        pre_tokenizer = { type = "Sequence", pretokenizers = {
          { type = "Split", pattern = { Regex = bpe.patterns.o200k }, behavior = "Isolated", invert = false },
          { type = "ByteLevel", add_prefix_space = false, trim_offsets = true, use_regex = false } } },
        decoder = { type = "ByteLevel", add_prefix_space = true, trim_offsets = true, use_regex = true },
        model = { type = "BPE", dropout = cjson.null, unk_token = cjson.null, continuing_subword_prefix = cjson.null,
          end_of_word_suffix = cjson.null, fuse_unk = false, byte_fallback = false, ignore_merges = true,
          vocab = map, merges = m } }
      local d = T.tmpdir()
      T.write(d .. "/tokenizer.json", cjson.encode(j))
      T.write(d .. "/tokenizer_config.json", cjson.encode({ bos_token = "<|startoftext|>", eos_token = "<|return|>" }))
      local tok = tokenizer.open(d)
      assert.are.equal("hf", tok.kind)
      assert.are.equal(201088, tok.vocab_size)
      check(tok, v.vectors, "harmony")
      check(tok, js.vectors, "js-tiktoken")
      assert.are.same({ 200002, 200012, 199999 }, tok.stop_ids)
      assert.is_false(tok:is_special(200005))
      assert.is_true(tok:is_special(200002))
      tok:close()
    end)

    it("reads the GGUF vocabulary (pre gpt-4o) to the same ids", function()
      local path = T.tmpdir() .. "/gpt-oss-vocab.gguf"
      T.write(path, require("loip.model.gguf").encode(o200k_forms.gguf_metadata(vocab())))
      local tok = tokenizer.open_file(path)
      assert.are.equal("gguf", tok.kind)
      assert.are.equal("o200k", tok.pretokenizer)
      assert.are.equal(201088, tok.vocab_size)
      assert.are.same({ 200002, 200012, 199999 }, tok.stop_ids)
      check(tok, v.vectors, "harmony")
      check(tok, js.vectors, "js-tiktoken")
      tok:close()
    end)
  end)
end)
