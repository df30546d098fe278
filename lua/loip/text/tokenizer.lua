-- Tokenizers: find the one a model directory ships and open it with the module for its format.
-- Every tokenizer object offers encode(text, opts) -> ids, decode(ids) -> text,
-- piece_text(prev, id) -> text of one token, vocab_size, bos_id, eos_id, path, kind, close().
-- The BPE ones (every format but llama2c) also offer decode_stream(), token_to_id(),
-- id_to_token(), is_special(), bos_token, eos_token and stop_ids (see tokenizers/bpe.lua).
--
-- In a directory, the first found of: tokenizer.json (Hugging Face), vocab.json + merges.txt
-- (Hugging Face, split form), tokenizer.model (tiktoken ranks or SentencePiece, told apart by
-- content), tokenizer.bin (llama2.c), tokenizer.gguf (a slice store made from a GGUF: the GGUF's
-- metadata), tok<vocab_size>.bin (llama2.c, with opts.vocab_size). A .gguf file is read for
-- the tokenizer in its metadata.
local json = require "loip.text.json"
local locate = require("loip.model.locate").locate
local chat = require "loip.text.chat"
local utf8 = require "loip.text.utf8"
local ffi = require "ffi"
local store_mod = require "loip.model.store"

local M = {}

M.formats = {
  llama2c = "loip.text.tokenizers.llama2c",             -- tokenizer.bin (llama2.c)
  hf = "loip.text.tokenizers.hf",                       -- tokenizer.json, vocab.json + merges.txt
  tiktoken = "loip.text.tokenizers.tiktoken",           -- tokenizer.model with base64 ranks (Llama 3, o200k)
  sentencepiece = "loip.text.tokenizers.sentencepiece", -- tokenizer.model, protobuf (Llama 2)
  gguf = "loip.text.tokenizers.gguf",                   -- a .gguf file's metadata (tokenizer.ggml.*)
}

local function head(path, n)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read(n) or ""
  f:close()
  return s
end

-- Format of the file at path: "hf" (tokenizer.json), "hf-split" (vocab.json or merges.txt),
-- "tiktoken", "sentencepiece", "gguf" or "llama2c"; by name, then by content.
function M.detect(path)
  local name = path:match("([^/]*)$")
  if name == "vocab.json" or name == "merges.txt" then return "hf-split" end
  if name:match("%.json$") then return "hf" end
  if name:match("%.bin$") then return "llama2c" end
  local h = head(path, 256)
  if h == nil then error(path .. ": cannot open the tokenizer file", 0) end
  if h:sub(1, 4) == "GGUF" then return "gguf" end
  if h:match("^%s*{") then return "hf" end
  if require(M.formats.tiktoken).sniff(h) then return "tiktoken" end
  -- A SentencePiece ModelProto starts with field 1 (pieces), length-delimited: 0x0A.
  if h:byte(1) == 0x0A then return "sentencepiece" end
  return "llama2c"
end

-- Open the tokenizer file at path, choosing the format by its name and content.
function M.open_file(path, opts)
  opts = opts or {}
  local kind = M.detect(path)
  if kind == "llama2c" then
    local t, err = require(M.formats.llama2c).open(path, opts)
    if not t then error(err, 0) end
    return t
  elseif kind == "hf" then
    return require(M.formats.hf).open_json(path, opts)
  elseif kind == "hf-split" then
    return require(M.formats.hf).open_split(path:match("^(.*)/[^/]*$") or ".", opts)
  end
  return require(M.formats[kind]).open(path, opts)
end

-- tok:apply_chat_template(messages, opts): the model directory's chat template rendered for
-- messages (see loip.chat.apply for opts); with opts.tokenize, the ids of that text (the
-- template writes the special tokens itself, so none are added).
local function apply_chat_template(self, messages, opts)
  opts = opts or {}
  if not self.dir then error("this tokenizer was opened from a file: its model directory (and template) is unknown", 2) end
  local text = chat.apply(self.dir, messages, opts)
  if opts.tokenize then return self:encode(text, { add_special = false, bos = false }) end
  return text
end

local function with_dir(t, dir)
  t.dir = dir
  t.apply_chat_template = apply_chat_template
  return t
end

-- The text of ids generated after the prompt ids, as they come: stream:put(id) -> text,
-- stream:finish() -> what was held back. Whole, well-formed UTF-8 characters (loip.text.utf8's
-- holder: a character split over tokens is held back until complete, bytes that cannot be
-- one become U+FFFD, as does a character left incomplete at finish), continuing the prompt's
-- text (no start-of-text rules such as dropping the dummy prefix's space) unless the prompt
-- shows no text (BOS alone, special tokens only); llama2c's tokenizer gives each id's piece
-- after the previous id.
function M.text_stream(tok, ids)
  local inner
  if tok.decode_stream then
    local continued = false
    for _, id in ipairs(ids) do
      if id ~= tok.bos_id and not tok:is_special(id) then continued = true break end
    end
    inner = tok:decode_stream({ continued = continued })
  else
    local prev = ids[#ids]
    inner = { put = function(_, id) local t = tok:piece_text(prev, id) prev = id return t end,
      finish = function() return "" end }
  end
  local h = utf8.holder()
  return { put = function(_, id) return h:put(inner:put(id)) end,
    finish = function() return h:put(inner:finish()) .. h:finish() end }
end

-- Find the tokenizer of a model directory (or use opts.path). Raises naming what was looked for.
function M.open(dir, opts)
  opts = opts or {}
  return with_dir(M.find(dir, opts), dir)
end

-- The vocabulary size of the model at dir (a llama2.c checkpoint's header, a slice store's
-- config), so that tok<N>.bin is found as the model finds it; nil when unknown.
local function model_vocab(kind, file)
  if kind == "llama2c" then
    local f = io.open(file, "rb")
    local h = f and f:read(28)
    if f then f:close() end
    if h and #h == 28 then
      local v = ffi.cast("const int32_t *", h)[5]
      return math.abs(v)
    end
  elseif kind == "store" then
    local ok, man = pcall(store_mod.read_manifest, file)
    if ok and type(man.config) == "table" then return man.config.vocab_size end
  end
end

function M.find(dir, opts)
  if opts.path then return M.open_file(opts.path, opts) end
  -- the tokenizer the model at dir runs with: a GGUF's own, a checkpoint's tok<vocab>.bin
  local ok, kind, file, tokdir = pcall(locate, dir)
  if ok then
    if kind == "gguf" then return M.open_file(file, opts) end
    if not opts.vocab_size then
      local v = model_vocab(kind, file)
      if v then opts = setmetatable({ vocab_size = v }, { __index = opts }) end
    end
    dir = tokdir or file
  elseif dir:match("%.gguf$") and json.exists(dir) then
    return M.open_file(dir, opts)
  end
  local looked = {}
  local function have(p)
    looked[#looked + 1] = p
    return json.exists(p)
  end
  if have(dir .. "/tokenizer.json") then return M.open_file(dir .. "/tokenizer.json", opts) end
  if have(dir .. "/vocab.json") and have(dir .. "/merges.txt") then
    return require(M.formats.hf).open_split(dir, opts)
  end
  for _, name in ipairs({ "tokenizer.model", "tokenizer.bin", "tokenizer.gguf" }) do
    if have(dir .. "/" .. name) then return M.open_file(dir .. "/" .. name, opts) end
  end
  if opts.vocab_size then
    local p = string.format("%s/tok%d.bin", dir, opts.vocab_size)
    if have(p) then return M.open_file(p, opts) end
  end
  error(string.format("%s: no tokenizer found (looked for %s)", dir, table.concat(looked, ", ")), 0)
end

return M
