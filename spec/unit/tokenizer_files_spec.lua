-- Tokenizer files made here: which file of a model directory is used, small tokenizers of
-- each format, and bad input (every failure names the file and the problem).
local cjson = require "cjson"
local T = require "spec.support"
local tokenizer = require "loip.text.tokenizer"

local function utf8(cp)
  if cp < 0x80 then return string.char(cp) end
  return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
end

-- GPT-2's bytes_to_unicode.
local b2u = {}
do
  local n = 0
  for b = 0, 255 do
    if (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or (b >= 174 and b <= 255) then b2u[b] = utf8(b)
    else b2u[b] = utf8(256 + n) n = n + 1 end
  end
end
local function spell(raw) return (raw:gsub(".", function(c) return b2u[c:byte()] end)) end

-- A small byte-level tokenizer.json: the 256 bytes, "ab" (256), "abc" (257), " a" (258),
-- "<|endoftext|>" (259, special); edit(j) may change it before it is written.
local function tiny_json(edit, files)
  local vocab = {}
  for b = 0, 255 do vocab[spell(string.char(b))] = b end
  vocab["ab"], vocab["abc"], vocab[spell(" a")] = 256, 257, 258
  local j = {
    version = "1.0",
    added_tokens = { { id = 259, content = "<|endoftext|>", special = true, normalized = false,
      lstrip = false, rstrip = false, single_word = false } },
    normalizer = cjson.null,
    pre_tokenizer = { type = "ByteLevel", add_prefix_space = false, use_regex = true },
    post_processor = cjson.null,
    decoder = { type = "ByteLevel" },
    model = { type = "BPE", vocab = vocab, merges = { "a b", "ab c", spell(" ") .. " a" } },
  }
  if edit then edit(j) end
  local dir = T.tmpdir()
  T.write(dir .. "/tokenizer.json", type(j) == "string" and j or cjson.encode(j))
  for name, text in pairs(files or {}) do T.write(dir .. "/" .. name, text) end
  return dir, dir .. "/tokenizer.json"
end

local function b64(s)
  local a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  local out = {}
  for i = 1, #s, 3 do
    local x, y, z = s:byte(i, i + 2)
    local n = x * 65536 + (y or 0) * 256 + (z or 0)
    local c = {}
    for k = 3, 0, -1 do
      local v = math.floor(n / 64 ^ k) % 64
      c[#c + 1] = a:sub(v + 1, v + 1)
    end
    if not y then c[3], c[4] = "=", "=" elseif not z then c[4] = "=" end
    out[#out + 1] = table.concat(c)
  end
  return table.concat(out)
end

-- tiktoken ranks: the 256 bytes, then extra pieces.
local function tiny_tiktoken(extra)
  local lines = {}
  for b = 0, 255 do lines[#lines + 1] = b64(string.char(b)) .. " " .. b end
  for i, p in ipairs(extra or {}) do lines[#lines + 1] = b64(p) .. " " .. (255 + i) end
  return table.concat(lines, "\n") .. "\n"
end

-- protobuf by hand: varints and length-delimited fields.
local function varint(n)
  local out = {}
  repeat
    local b = n % 128
    n = math.floor(n / 128)
    out[#out + 1] = string.char(n > 0 and b + 128 or b)
  until n == 0
  return table.concat(out)
end
local function field(num, payload) return varint(num * 8 + 2) .. varint(#payload) .. payload end
local function vfield(num, v) return varint(num * 8) .. varint(v) end
local function f32(x)
  local ffi = require "ffi"
  return ffi.string(ffi.new("float[1]", x), 4)
end
local function piece(s, score, ty)
  return field(1, field(1, s) .. varint(2 * 8 + 5) .. f32(score) .. vfield(3, ty))
end

-- A SentencePiece BPE model: <unk> <s> </s> ▁ a b ▁a ab ▁ab, byte fallback off.
local function tiny_spm(model_type)
  local U = "\226\150\129"
  local pieces = { { "<unk>", 0, 2 }, { "<s>", 0, 3 }, { "</s>", 0, 3 }, { U, -5, 1 }, { "a", -6, 1 },
    { "b", -7, 1 }, { U .. "a", -1, 1 }, { "ab", -2, 1 }, { U .. "ab", -3, 1 } }
  local out = {}
  for _, p in ipairs(pieces) do out[#out + 1] = piece(p[1], p[2], p[3]) end
  out[#out + 1] = field(2, vfield(3, model_type or 2) .. vfield(4, #pieces))
  out[#out + 1] = field(3, field(1, "identity") .. vfield(3, 1) .. vfield(4, 0))
  return table.concat(out)
end

local function raises(pattern_list, fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "no error raised")
  err = tostring(err)
  for _, p in ipairs(pattern_list) do
    assert.is_truthy(err:find(p, 1, true), string.format("error %q lacks %q", err, p))
  end
  return err
end

describe("tokenizer files", function()
  after_each(function()
    T.cleanup()
    collectgarbage()
    collectgarbage()
  end)

  it("prefers tokenizer.json, then vocab.json + merges.txt, tokenizer.model, tokenizer.bin", function()
    local dir = tiny_json()
    local vocab = {}
    for b = 0, 255 do vocab[spell(string.char(b))] = b end
    T.write(dir .. "/vocab.json", cjson.encode(vocab))
    T.write(dir .. "/merges.txt", "#version: 0.2\n")
    T.write(dir .. "/tokenizer.model", tiny_tiktoken())
    T.write(dir .. "/tokenizer.bin", T.read(T.root .. "/models/stories260K/tok512.bin"))
    local kinds = {}
    for _, remove in ipairs({ "tokenizer.json", "vocab.json", "tokenizer.model", "tokenizer.bin" }) do
      local tok = tokenizer.open(dir)
      kinds[#kinds + 1] = tok.kind
      tok:close()
      os.remove(dir .. "/" .. remove)
    end
    assert.are.same({ "hf", "hf-split", "tiktoken", "llama2c" }, kinds)
    raises({ dir, "no tokenizer found", "tokenizer.json", "tokenizer.bin" }, function() tokenizer.open(dir) end)
    -- A SentencePiece tokenizer.model is told from a tiktoken one by its content.
    T.write(dir .. "/tokenizer.model", tiny_spm())
    assert.are.equal("sentencepiece", tokenizer.open(dir).kind)
    -- The llama2c options still work.
    local tok = tokenizer.open(dir, { path = T.root .. "/models/stories260K/tok512.bin", vocab_size = 512 })
    assert.are.equal("llama2c", tok.kind)
    assert.are.equal(512, tok.vocab_size)
  end)

  it("encodes and decodes with a small byte-level tokenizer.json", function()
    local tok = tokenizer.open(tiny_json())
    assert.are.same({ 257, 258, 256, 259, 100 }, tok:encode("abc aab<|endoftext|>d"))
    assert.are.equal("abc aab<|endoftext|>d", tok:decode({ 257, 258, 256, 259, 100 }))
    assert.are.equal("abc aabd", tok:decode({ 257, 258, 256, 259, 100 }, { skip_special = true }))
    assert.are.equal(260, tok.vocab_size)
    assert.are.equal(259, tok.eos_id) -- no config: the usual end-of-text names are looked for
    assert.has_error(function() tok:encode(42) end)
    raises({ "tokenizer.json", "token id 999" }, function() tok:decode({ 999 }) end)
  end)

  it("applies lstrip / rstrip of added tokens and the ByteLevel prefix space", function()
    local tok = tokenizer.open(tiny_json(function(j)
      j.added_tokens[1].lstrip, j.added_tokens[1].rstrip = true, true
      j.pre_tokenizer.add_prefix_space = true
    end))
    assert.are.same({ 258, 259, 258 }, tok:encode("a  <|endoftext|> \t a"))
  end)

  it("encodes with a small tiktoken file and a small SentencePiece model", function()
    local dir = T.tmpdir()
    T.write(dir .. "/tokenizer.model", tiny_tiktoken({ "ab", "abc" }))
    local tok = tokenizer.open(dir)
    assert.are.equal("tiktoken", tok.kind)
    assert.are.same({ 258, 257, 97 }, tok:encode("abca"))
    assert.are.equal(258, tok.bos_id) -- Llama 3's specials follow the ranks
    local spm_dir = T.tmpdir()
    T.write(spm_dir .. "/tokenizer.model", tiny_spm())
    local spm = tokenizer.open(spm_dir)
    -- "▁ab▁bab▁c": ▁a (best score) first, then ab, then ▁a + b; "c" has no piece: <unk>.
    assert.are.same({ 1, 8, 3, 5, 7, 3, 0 }, spm:encode("ab bab c"))
    assert.are.equal("ab bab  \226\129\135 ", spm:decode({ 1, 8, 3, 5, 7, 3, 0 }))
  end)

  it("reads JSON escapes in vocab keys and merges: \\uXXXX, surrogate pairs, \\n \\\" \\\\ \\/", function()
    local dir, p = tiny_json(function(j)
      j.model.vocab["\240\159\152\128"] = 260 -- U+1F600, outside GPT-2's alphabet: kept as is
      j.model.vocab["x\n\"\\/y"] = 261
    end)
    local text = T.read(p)
    local function sub(from, to)
      local a, b = text:find(from, 1, true)
      assert(a, from)
      text = text:sub(1, a - 1) .. to .. text:sub(b + 1)
    end
    -- cjson writes U+1F600 as raw UTF-8, "/" as "\/": spell keys and merges with escapes.
    sub('"ab":256', '"\\u0061\\u0062":256')
    sub('"abc":257', '"a\\u0062c":257')
    sub('"\240\159\152\128":260', '"\\ud83d\\uDE00":260')
    sub('"ab c"', '"\\u0061b\\u0020c"') -- the space too: split after decoding, as HF does
    assert.is_truthy(text:find('"x\\n\\"\\\\\\/y":261', 1, true))
    T.write(p, text)
    local tok = tokenizer.open(dir)
    assert.are.same({ 257, 258, 256, 259, 100 }, tok:encode("abc aab<|endoftext|>d"))
    assert.are.equal(260, tok:token_to_id("\240\159\152\128"))
    assert.are.equal(261, tok:token_to_id("x\n\"\\/y"))
    assert.are.equal(262, tok.vocab_size)
    tok:close()
  end)

  describe("reports bad input", function()
    it("tokenizer.json that is not JSON, or has no model, or an unsupported one", function()
      local _, p = tiny_json(function() end)
      T.write(p, "{ \"model\": ")
      raises({ p, "invalid JSON" }, function() tokenizer.open_file(p) end)
      _, p = tiny_json(function(j) j.model = nil end)
      raises({ p, "no \"model\"" }, function() tokenizer.open_file(p) end)
      _, p = tiny_json(function(j) j.model.type = "WordPiece" end)
      raises({ p, "model type \"WordPiece\" is not supported" }, function() tokenizer.open_file(p) end)
      _, p = tiny_json(function(j) j.normalizer = { type = "Lowercase" } end)
      raises({ p, "normalizer \"Lowercase\" is not supported" }, function() tokenizer.open_file(p) end)
      _, p = tiny_json(function(j) j.pre_tokenizer = { type = "BertPreTokenizer" } end)
      raises({ p, "pre_tokenizer \"BertPreTokenizer\" is not supported" }, function() tokenizer.open_file(p) end)
      _, p = tiny_json(function(j) j.decoder = { type = "WordPiece" } end)
      raises({ p, "decoder \"WordPiece\" is not supported" }, function() tokenizer.open_file(p) end)
    end)

    it("merges that name pieces the vocabulary lacks", function()
      local _, p = tiny_json(function(j) j.model.merges = { "a b", "ab zz" } end)
      local at = T.read(p):find('"ab zz"', 1, true) - 1
      raises({ p, "merges[2] at byte " .. at, "\"zz\" is not in the vocabulary" },
        function() tokenizer.open_file(p) end)
      _, p = tiny_json(function(j) j.model.merges = { "b c" } end)
      raises({ p, "merges[1]", "merged piece \"bc\" is not in the vocabulary" }, function() tokenizer.open_file(p) end)
      _, p = tiny_json(function(j) j.model.merges = { "a b c" } end)
      raises({ p, "merges[1]", "one space" }, function() tokenizer.open_file(p) end)
      -- merges.txt: the line number.
      local dir = T.tmpdir()
      local vocab = {}
      for b = 0, 255 do vocab[spell(string.char(b))] = b end
      vocab.ab = 256
      T.write(dir .. "/vocab.json", cjson.encode(vocab))
      T.write(dir .. "/merges.txt", "#version: 0.2\na b\na q x\n")
      raises({ dir .. "/merges.txt", "merges line 3" }, function() tokenizer.open(dir) end)
      T.write(dir .. "/merges.txt", "#version: 0.2\na b\nab ab\n")
      raises({ dir .. "/merges.txt", "merges line 3", "\"abab\" is not in the vocabulary" },
        function() tokenizer.open(dir) end)
    end)

    -- Malformed JSON in the sections read in C: the file, the byte offset (from 0) and what.
    local function broken(from, to, edit)
      local _, p = tiny_json(edit)
      local text = T.read(p)
      local a, b = text:find(from, 1, true)
      assert(a, from)
      text = text:sub(1, a - 1) .. to .. text:sub(b + 1)
      T.write(p, text)
      return p, a - 1, text
    end

    it("malformed JSON in the vocab or the merges, with the byte offset", function()
      local p, at = broken('"ab":256', '"ab" 256')
      raises({ p, "invalid JSON at byte " .. (at + 5), "expected ':'" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab":256', '"ab":256,}')
      raises({ p, "invalid JSON at byte " .. (at + 9), "expected a string key" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab":256', '"a\\qb":256')
      raises({ p, "invalid JSON at byte " .. (at + 2), "unknown escape \\q" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab":256', '"a\\ud83db":256')
      raises({ p, "invalid JSON at byte " .. (at + 2), "high surrogate \\uD83D without a low one" },
        function() tokenizer.open_file(p) end)
      p, at = broken('"ab":256', '"a\\uDE00b":256')
      raises({ p, "invalid JSON at byte " .. (at + 2), "lone low surrogate" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab":256', '"a\\u12xb":256')
      raises({ p, "invalid JSON at byte " .. (at + 2), "4 hex digits" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab":256', '"a\tb":256')
      raises({ p, "invalid JSON at byte " .. (at + 2), "control character" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab":256', '"ab":0256')
      raises({ p, "invalid JSON at byte " .. (at + 5), "leading zero" }, function() tokenizer.open_file(p) end)
      -- Well-formed JSON of the wrong shape.
      p, at = broken('"ab":256', '"ab":2.5')
      raises({ p, "vocab at byte " .. (at + 5), "\"ab\" has id 2.5" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab":256', '"ab":"x"')
      raises({ p, "vocab at byte " .. (at + 5), "not an integer" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab":256', '"ab":-1')
      raises({ p, "vocab at byte " .. (at + 5), "not an integer" }, function() tokenizer.open_file(p) end)
      p, at = broken('"abc":257', '"abc":256')
      raises({ p, "vocab at byte ", "token id 256 is given twice" }, function() tokenizer.open_file(p) end)
      -- The merges.
      p, at = broken('"ab c"', '"ab c" "x"')
      raises({ p, "invalid JSON at byte " .. (at + 7), "expected ',' or ']'" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab c"', '["ab", "c", "d"]')
      raises({ p, "merges[2] at byte " .. at, "not a pair of strings" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab c"', '["ab", 3]')
      raises({ p, "merges[2] at byte " .. at, "not a pair of strings" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab c"', '42')
      raises({ p, "merges[2] at byte " .. at, "not a string \"a b\" or a pair" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab c"', '["ab" "c"]')
      raises({ p, "invalid JSON at byte " .. (at + 6), "expected ',' or ']'" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab c"', '["ab", "zz"]')
      raises({ p, "merges[2] at byte " .. at, "\"zz\" is not in the vocabulary" }, function() tokenizer.open_file(p) end)
      -- Cut inside the merges; text after the value; a section given twice.
      local text
      p, at, text = broken('"ab c"', '"ab c')
      T.write(p, text:sub(1, at + 5))
      raises({ p, "invalid JSON at byte " .. at, "not closed" }, function() tokenizer.open_file(p) end)
      p, at = broken('"ab c"', '"ab c"')
      T.write(p, T.read(p) .. " {}")
      raises({ p, "invalid JSON at byte " .. (#T.read(p) - 2), "more text after" }, function() tokenizer.open_file(p) end)
      p = broken('"type":"BPE"', '"type":"BPE","merges":[]')
      raises({ p, "model has \"merges\" twice" }, function() tokenizer.open_file(p) end)
      p = broken('"type":"BPE"', '"type":"BPE","vocab":[]', function(j) j.model.vocab = nil end)
      raises({ p, "vocab at byte ", "expected an object" }, function() tokenizer.open_file(p) end)
      p = broken('"type":"BPE"', '"type":"BPE"', function(j) j.model.merges = nil end)
      raises({ p, "no vocab or merges" }, function() tokenizer.open_file(p) end)
    end)

    it("malformed vocab.json, with the byte offset", function()
      local dir = T.tmpdir()
      T.write(dir .. "/vocab.json", '{"a": 0, "b": 1,\n "c" 2}')
      T.write(dir .. "/merges.txt", "#version: 0.2\n")
      raises({ dir .. "/vocab.json", "invalid JSON at byte 22", "expected ':'" }, function() tokenizer.open(dir) end)
      T.write(dir .. "/vocab.json", '["a"]')
      raises({ dir .. "/vocab.json", "vocab at byte 0: expected an object" }, function() tokenizer.open(dir) end)
    end)

    it("a pre-tokenizer regex that does not compile, with PCRE2's message and offset", function()
      local _, p = tiny_json(function(j)
        j.pre_tokenizer = { type = "Split", pattern = { Regex = "(?i:'s|[a-z" }, behavior = "Isolated", invert = false }
      end)
      raises({ p, "regex does not compile", "missing terminating ] for character class", "at offset 11" },
        function() tokenizer.open_file(p) end)
      _, p = tiny_json(function(j)
        j.pre_tokenizer = { type = "Split", pattern = { Regex = "a" }, behavior = "Sideways", invert = false }
      end)
      raises({ p, "unknown split behavior \"Sideways\"" }, function() tokenizer.open_file(p) end)
    end)

    it("special tokens that are not in the vocabulary", function()
      local dir, p = tiny_json(nil, { ["tokenizer_config.json"] = cjson.encode({ eos_token = "<|nope|>" }) })
      raises({ dir .. "/tokenizer_config.json", "eos_token \"<|nope|>\" is not a token" },
        function() tokenizer.open_file(p) end)
      _, p = tiny_json(function(j)
        j.post_processor = { type = "TemplateProcessing",
          single = { { SpecialToken = { id = "<s>", type_id = 0 } }, { Sequence = { id = "A", type_id = 0 } } },
          special_tokens = {} }
      end)
      raises({ p, "special token \"<s>\" is not in its special_tokens" }, function() tokenizer.open_file(p) end)
      -- tiktoken's special_tokens.json
      local tdir = T.tmpdir()
      T.write(tdir .. "/tokenizer.model", tiny_tiktoken())
      T.write(tdir .. "/special_tokens.json", cjson.encode({ special_tokens = { ["<|begin_of_text|>"] = 10 } }))
      raises({ tdir .. "/special_tokens.json", "has id 10, a rank of" }, function() tokenizer.open(tdir) end)
      T.write(tdir .. "/special_tokens.json", cjson.encode({ special_tokens = { ["<|x|>"] = 300 } }))
      raises({ tdir .. "/special_tokens.json", "no special token <|begin_of_text|>" }, function() tokenizer.open(tdir) end)
    end)

    it("malformed tiktoken lines", function()
      local dir = T.tmpdir()
      T.write(dir .. "/tokenizer.model", "IQ== 0\nnot base64! 1\n")
      raises({ dir .. "/tokenizer.model", "tiktoken line 2" }, function() tokenizer.open(dir) end)
      T.write(dir .. "/tokenizer.model", "IQ== 0\nIg== 0\n")
      raises({ dir .. "/tokenizer.model", "tiktoken line 2", "given twice" }, function() tokenizer.open(dir) end)
    end)

    it("truncated or unsupported SentencePiece models", function()
      local dir = T.tmpdir()
      local p = dir .. "/tokenizer.model"
      local full = tiny_spm()
      T.write(p, full:sub(1, 20))
      raises({ p, "truncated" }, function() tokenizer.open_file(p) end)
      -- Cut between two pieces: the specs that follow them are missing.
      local cut = #piece("<unk>", 0, 2) + #piece("<s>", 0, 3)
      T.write(p, full:sub(1, cut))
      raises({ p, "no trainer_spec after its 2 pieces", "truncated" }, function() tokenizer.open_file(p) end)
      T.write(p, tiny_spm(1))
      raises({ p, "model type unigram is not supported" }, function() tokenizer.open_file(p) end)
      local shared_model = T.fixture_path("models/llama2-tokenizer/tokenizer.model")
      if shared_model then
        T.write(p, T.read(shared_model):sub(1, 300000))
        raises({ p, "truncated or malformed at byte" }, function() tokenizer.open_file(p) end)
      end
    end)
  end)
end)
