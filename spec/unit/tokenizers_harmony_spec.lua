-- o200k_harmony, gpt-oss's tokenizer: o200k_base's pre-tokenizer regex (bpe.patterns.o200k)
-- against Python's `regex` module with tiktoken's pattern, and the tiktoken reader with the
-- harmony special tokens against openai/harmony's token-id test vectors, on the pieces of the
-- vocabulary in models/o200k-harmony (its README says how they were found; the whole
-- o200k_base.tiktoken could not be had). Then a GGUF vocabulary as llama.cpp's converter
-- writes gpt-oss's (tokenizer.ggml.pre "gpt-4o"): the same regex, special tokens and stop ids.
local ffi = require "ffi"
local cjson = require "cjson"
local loip = require "loip"
local T = require "spec.support"
local bpe = require "loip.text.tokenizers.bpe"
local tiktoken = require "loip.text.tokenizers.tiktoken"
local tokenizer = require "loip.text.tokenizer"
local C = loip.C

teardown(function() T.cleanup() end)

local DIR = "models/o200k-harmony"

local function fixture()
  local p, why = T.fixture_path(DIR .. "/vectors.json")
  if not p then return nil, why end
  return cjson.decode(T.read(p)), p:match("^(.*)/[^/]*$")
end

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

describe("o200k_harmony", function()
  after_each(function() collectgarbage() collectgarbage() end)

  local v, dir = fixture()
  if not v then
    it("needs its fixture", function() pending(dir) end)
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

  it("tokenizes harmony's test vectors to their ids, and back", function()
    local tok = tiktoken.open(dir .. "/o200k_pieces.tiktoken")
    assert.are.equal("o200k", tok.pretokenizer)
    assert.are.equal(201088, tok.vocab_size)
    for _, c in ipairs(v.vectors) do
      assert.are.same(c.ids, tok:encode(c.text), c.name)
      assert.are.equal(c.text, tok:decode(c.ids), c.name)
    end
    assert.are.equal(5, #v.vectors)
    tok:close()
  end)

  it("has the harmony special tokens at their ids, <|return|> and <|call|> ending a generation", function()
    local tok = tiktoken.open(dir .. "/o200k_pieces.tiktoken")
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
    assert.are.equal("<|start|>", tok:decode(plain))
    tok:close()
  end)

  it("is taken for o200k_harmony by its 199,998 ranks, with no special_tokens.json", function()
    local d = T.tmpdir()
    local lines = {}
    for line in io.lines(dir .. "/o200k_pieces.tiktoken") do lines[#lines + 1] = line end
    lines[#lines + 1] = "enp6eno= 199997" -- (a made-up last rank: only the count matters here)
    T.write(d .. "/o200k_base.tiktoken", table.concat(lines, "\n") .. "\n")
    local tok = tokenizer.open_file(d .. "/o200k_base.tiktoken")
    assert.are.equal("tiktoken", tok.kind)
    assert.are.equal("o200k", tok.pretokenizer)
    assert.are.same({ 200006, 24912, 2375, 200007 }, tok:encode("<|start|>hello world<|end|>"))
    tok:close()
    -- an encoding that is not known is an error naming the file and the field
    T.write(d .. "/special_tokens.json", cjson.encode({ encoding = "p50k" }))
    local ok, err = pcall(tiktoken.open, d .. "/o200k_base.tiktoken")
    assert.is_false(ok)
    assert.matches("special_tokens.json: \"encoding\" is 'p50k', not an encoding loip knows", err, 1, true)
  end)

  it("reads gpt-oss's tokenizer.json form (Split by o200k's regex, ByteLevel, the harmony added tokens)", function()
    local vocab, added = {}, {}
    for line in io.lines(dir .. "/o200k_pieces.tiktoken") do
      local b64, rank = line:match("^(%S+) (%d+)$")
      vocab[#vocab + 1] = { b64, tonumber(rank) }
    end
    local tok0 = tiktoken.open(dir .. "/o200k_pieces.tiktoken") -- (its pieces' bytes, in GPT-2's spelling)
    local spelled = {}
    for _, v in ipairs(vocab) do spelled[bpe.gpt2_encode(tok0:piece(v[2]))] = v[2] end
    for name, id in pairs(tiktoken.o200k_harmony_special_tokens()) do
      added[#added + 1] = { id = id, content = name, single_word = false, lstrip = false, rstrip = false, normalized = false, special = true }
    end
    table.sort(added, function(a, b) return a.id < b.id end)
    tok0:close()
    local j = { version = "1.0", added_tokens = added, normalizer = cjson.null, post_processor = cjson.null,
      pre_tokenizer = { type = "Sequence", pretokenizers = {
        { type = "Split", pattern = { Regex = bpe.patterns.o200k }, behavior = "Isolated", invert = false },
        { type = "ByteLevel", add_prefix_space = false, trim_offsets = true, use_regex = false } } },
      decoder = { type = "ByteLevel", add_prefix_space = true, trim_offsets = true, use_regex = true },
      model = { type = "BPE", dropout = cjson.null, unk_token = cjson.null, continuing_subword_prefix = cjson.null,
        end_of_word_suffix = cjson.null, fuse_unk = false, byte_fallback = false, ignore_merges = true,
        vocab = spelled, merges = {} } }
    local d = T.tmpdir()
    T.write(d .. "/tokenizer.json", (cjson.encode(j):gsub('"merges":{}', '"merges":[]'))) -- (no merges: whole pieces)
    T.write(d .. "/tokenizer_config.json", cjson.encode({ bos_token = "<|startoftext|>", eos_token = "<|return|>" }))
    local tok = tokenizer.open(d)
    assert.are.equal("hf", tok.kind)
    for _, c in ipairs(v.vectors) do
      assert.are.same(c.ids, tok:encode(c.text), c.name)
      assert.are.equal(c.text, tok:decode(c.ids), c.name)
    end
    assert.are.same({ 200002, 200012, 199999 }, tok.stop_ids)
    assert.is_false(tok:is_special(200005))
    assert.is_true(tok:is_special(200002))
    tok:close()
  end)

  it("reads a GGUF vocabulary as llama.cpp's converter writes gpt-oss's (pre gpt-4o)", function()
    -- the 256 byte tokens in GPT-2's spelling (o200k_base's order), the ids up to 199997
    -- unused pieces of their own, then the special tokens as control tokens
    local tokens, types, order = {}, {}, {}
    for b = 33, 126 do order[#order + 1] = b end
    for b = 161, 172 do order[#order + 1] = b end
    for b = 174, 255 do order[#order + 1] = b end
    local used = {}
    for _, b in ipairs(order) do used[b] = true end
    for b = 0, 255 do if not used[b] then order[#order + 1] = b end end
    for r = 0, 255 do tokens[r + 1], types[r + 1] = bpe.gpt2_encode(string.char(order[r + 1])), 1 end
    for id = 256, 199997 do tokens[id + 1], types[id + 1] = string.format("[UNUSED_%d]", id), 5 end
    local specials = tiktoken.o200k_harmony_special_tokens()
    for name, id in pairs(specials) do tokens[id + 1], types[id + 1] = name, 3 end
    local path = T.tmpdir() .. "/gpt-oss-vocab.gguf"
    T.write(path, require("loip.model.gguf").encode({
      { "tokenizer.ggml.model", "STRING", "gpt2" }, { "tokenizer.ggml.pre", "STRING", "gpt-4o" },
      { "tokenizer.ggml.tokens", "ARRAY[STRING]", tokens }, { "tokenizer.ggml.token_type", "ARRAY[INT32]", types },
      { "tokenizer.ggml.merges", "ARRAY[STRING]", {} },
      { "tokenizer.ggml.bos_token_id", "UINT32", 199998 }, { "tokenizer.ggml.eos_token_id", "UINT32", 200002 },
      { "tokenizer.ggml.padding_token_id", "UINT32", 199999 },
    }))
    local tok = tokenizer.open_file(path)
    assert.are.equal("gguf", tok.kind)
    assert.are.equal("o200k", tok.pretokenizer)
    assert.are.equal(201088, tok.vocab_size)
    assert.are.same({ 200002, 200012, 199999 }, tok.stop_ids)
    assert.are.same({ 200006, 72, 200005, 200008, 220, 0, 200007 }, tok:encode("<|start|>i<|channel|><|message|> !<|end|>"))
    tok:close()
  end)
end)
