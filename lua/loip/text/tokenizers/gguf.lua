-- The tokenizer a GGUF file carries in its metadata (tokenizer.ggml.*), as llama.cpp reads it:
--   model "llama"  SentencePiece-style BPE: tokens (spaces as "▁"), scores and token types;
--                  merges by score, byte fallback, the dummy prefix (add_space_prefix);
--   model "gpt2"   byte-level BPE: tokens in GPT-2's spelling, merges ("left right"), the
--                  pre-tokenizer named by tokenizer.ggml.pre.
-- Token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte. Control and
-- user-defined tokens written in the text are those tokens (parse_special = false: text).
-- BOS/EOS/UNK ids and the add-BOS/EOS flags come from the metadata; the stop ids also from
-- eot/eom. The file may be a whole model or metadata only (a slice store's tokenizer.gguf).
local bit = require "bit"
local core = require "loip.core"
local gguf = require "loip.model.gguf"
local bpe = require "loip.text.tokenizers.bpe"
local sentencepiece = require "loip.text.tokenizers.sentencepiece"
local tk = require "loip.runtime.tokenizer"
local K = core.constants

local M = {}

-- tokenizer.ggml.pre (llama.cpp's names) -> loip's pre-tokenizer (bpe.patterns).
M.pretokenizers = {
  ["default"] = "gpt2", ["gpt-2"] = "gpt2", ["gpt2"] = "gpt2",
  ["llama-bpe"] = "llama3", ["llama3"] = "llama3", ["llama-v3"] = "llama3", ["smaug-bpe"] = "llama3",
  ["qwen2"] = "qwen2",
  ["gpt-4o"] = "o200k", -- o200k_base's regex: GPT-4o and gpt-oss (o200k_harmony)
}

local TYPE_CONTROL, TYPE_USER, TYPE_UNUSED = 3, 4, 5

local function list(md, path, key, n, kind)
  local v = md[key]
  if v == nil then
    if n == nil then error(string.format("%s: metadata %s is missing", path, key), 0) end
    return nil
  end
  if type(v) ~= "table" then error(string.format("%s: metadata %s is not an array", path, key), 0) end
  if n and #v ~= n then
    error(string.format("%s: metadata %s has %d entries, tokenizer.ggml.tokens %d", path, key, #v, n), 0)
  end
  for i, x in ipairs(v) do
    if type(x) ~= kind then error(string.format("%s: metadata %s[%d] is not a %s", path, key, i - 1, kind), 0) end
  end
  return v
end

-- An id from the metadata (nil when absent, or a GGUF "none": -1 / 0xFFFFFFFF); checked
-- against the vocabulary.
local function id_of(md, path, key, n)
  local v = md[key]
  if v == nil or v == 0xFFFFFFFF or v == -1 then return nil end
  if type(v) ~= "number" or v < 0 or v >= n or v ~= math.floor(v) then
    error(string.format("%s: metadata %s = %s is not a token id in [0, %d)", path, key, tostring(v), n), 0)
  end
  return v
end

local function flag(md, path, key, default)
  local v = md[key]
  if v == nil then return default end
  if type(v) ~= "boolean" then error(string.format("%s: metadata %s is not a BOOL", path, key), 0) end
  return v
end

local function spm(md, path, tokens, types)
  local scores = list(md, path, "tokenizer.ggml.scores", #tokens, "number")
  local n = #tokens
  local info = {
    byte_fallback = true, add_dummy_prefix = flag(md, path, "tokenizer.ggml.add_space_prefix", true),
    remove_extra_whitespaces = flag(md, path, "tokenizer.ggml.remove_extra_whitespaces", false),
    escape_whitespaces = true, treat_whitespace_as_suffix = false,
    unk_id = id_of(md, path, "tokenizer.ggml.unknown_token_id", n) or -1,
    bos_id = id_of(md, path, "tokenizer.ggml.bos_token_id", n), eos_id = id_of(md, path, "tokenizer.ggml.eos_token_id", n),
  }
  return sentencepiece.build(path, n, info, function(id)
    return tokens[id + 1], scores and scores[id + 1] or 0, types and types[id + 1] or 1
  end, "gguf")
end

local function gpt2(md, path, tokens, types, opts)
  local merges = list(md, path, "tokenizer.ggml.merges", nil, "string")
  local pre = md["tokenizer.ggml.pre"] or "default"
  local name = opts.pretokenizer or M.pretokenizers[pre]
  if not name then
    local known = {}
    for k in pairs(M.pretokenizers) do known[#known + 1] = k end
    table.sort(known)
    error(string.format("%s: tokenizer.ggml.pre '%s' is not a pre-tokenizer loip knows (%s)", path, tostring(pre),
      table.concat(known, ", ")), 0)
  end
  local flags = bit.bor(K.BPE_BYTELEVEL, K.BPE_GPT2_SPELLING)
  if name == "llama3" then flags = bit.bor(flags, K.BPE_IGNORE_MERGES) end
  local h = bpe.bpe(flags, path)
  local added = {}
  for i, t in ipairs(tokens) do
    local ty = types and types[i] or 1
    if t == "" then error(string.format("%s: tokenizer.ggml.tokens[%d] is empty", path, i - 1), 0) end
    if ty == TYPE_CONTROL or ty == TYPE_USER then
      added[#added + 1] = { content = t, id = i - 1, special = ty == TYPE_CONTROL }
    end
    local unmatched = (ty == TYPE_CONTROL or ty == TYPE_UNUSED) and K.BPE_PIECE_UNMATCHED or 0
    assert(tk.bpe_add_token(h, t, i - 1, 0, unmatched, path .. ": tokenizer.ggml.tokens[" .. (i - 1) .. "]"))
  end
  local text = table.concat(merges, "\n")
  assert(tk.bpe_add_merges(h, text, 0, path .. ": tokenizer.ggml.merges"))
  local n = #tokens
  local desc = {
    path = path, kind = "gguf", bpe = h, added = added,
    normalizers = name == "qwen2" and { { type = "nfc" } } or {},
    byte_level = true, spelling = "gpt2", decoder = { { type = "bytes" } }, pretokenizer = name,
    bos_id = id_of(md, path, "tokenizer.ggml.bos_token_id", n), eos_id = id_of(md, path, "tokenizer.ggml.eos_token_id", n),
  }
  desc.pretok = bpe.pretok({ { pattern = bpe.patterns[name] } }, path)
  return bpe.new(desc)
end

-- The tokenizer of the GGUF at path. opts.pretokenizer: a bpe.patterns name to use instead of
-- the one tokenizer.ggml.pre names.
function M.open(path, opts)
  opts = opts or {}
  local g = gguf.open(path)
  local ok, tok = pcall(function()
    local md = g.metadata
    local model = md["tokenizer.ggml.model"]
    if model == nil then error(path .. ": metadata tokenizer.ggml.model is missing (the file carries no tokenizer)", 0) end
    local tokens = list(md, path, "tokenizer.ggml.tokens", nil, "string")
    local types = list(md, path, "tokenizer.ggml.token_type", #tokens, "number")
    local t
    if model == "llama" then t = spm(md, path, tokens, types)
    elseif model == "gpt2" then t = gpt2(md, path, tokens, types, opts)
    else
      error(string.format("%s: tokenizer.ggml.model '%s' is not supported (llama, gpt2 are)", path, tostring(model)), 0)
    end
    local n = #tokens
    local bos_default = model == "llama"
    t.prefix_ids = (flag(md, path, "tokenizer.ggml.add_bos_token", bos_default) and t.bos_id) and { t.bos_id } or {}
    t.suffix_ids = (flag(md, path, "tokenizer.ggml.add_eos_token", false) and t.eos_id) and { t.eos_id } or {}
    t.ggml_model, t.chat_template = model, md["tokenizer.chat_template"]
    for _, k in ipairs({ "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id" }) do
      local id = id_of(md, path, k, n)
      if id then
        local seen = false
        for _, s in ipairs(t.stop_ids) do seen = seen or s == id end
        if not seen then t.stop_ids[#t.stop_ids + 1] = id end
      end
    end
    return t
  end)
  g:close()
  if not ok then error(tok, 0) end
  return tok
end

return M
